"""One node as the load-aware extender sees it, as a document — `koordbus calc loadaware`'s input — read and written.
Pure.

The document (../shared/design/CALC-CONTRACT.md, kind `loadaware`) is `{"now", "args", "node", "nodeMetric",
"assignedPods": [{"pod", "assignedAt"}], "pod"}` in Kubernetes' and Koordinator's shapes. `read` decodes it into a
LoadState through the extender's own apply methods (the Node, the NodeMetric read by `metric_view_of`, each assigned
pod as the pod watch would report it), so `decide` — core.filter_node, core.score_node and the node's cache — is the
extender's arithmetic, not a second one. `export` writes a live LoadState's node back as such a document, which
`read` turns into the same state: what `GET /api/v1/scheduler/nodes/{node}/state` serves and `koordbus scheduler
explain --offline` replays.

Two koordbus extensions, which Koordinator's objects never carry: `nodeQoS` (`{"resourceThresholdStrategy",
"avoidEvictionLoops"}`, the node QoS strategy the extender applies to the node, whose eviction caps then apply as in
the service; without it nothing is capped), and the NodeMetric annotation `koordbus.io/node-usage-missing: "true"`
(our report had no node usage, which the extender reads as "no data", services.loadaware.state.metric_view).
Times are RFC 3339, read and written to the nanosecond, as exactly as float64 seconds hold them. Used by
koordbus.calc_loadaware, koordbus.scheduler and the loadaware service.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any, Final

import msgspec

from schemas import koordinator, kube, nodemetric_json, quantity, resources, vocab
from services.common import watermarks
from services.common.args import ArgsError
from services.loadaware import core, state
from services.loadaware.args import LoadAwareArgs, check_args, convert_args, to_json, with_defaults

NODE_USAGE_MISSING_ANNOTATION: Final = "koordbus.io/node-usage-missing"
GO_ZERO_TIME: Final = "0001-01-01T00:00:00Z"
_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class SnapshotError(ValueError):
    """The document is not one node's state (malformed: a missing field, a bad time or duration); the message
    starts with the JSON path."""


class AssignedPodInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    pod: kube.Pod
    assigned_at: str | None = None
    """When the scheduler assigned it, RFC 3339 (used when the pod has no PodScheduled condition); default `now`."""


class NodeQoSInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    resource_threshold_strategy: dict[str, Any] = {}
    avoid_eviction_loops: bool = True


class NodeStateInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    now: str
    """RFC 3339, read to the nanosecond (`parse_time`)."""
    node: kube.Node
    args: dict[str, Any] | None = None
    node_metric: dict[str, Any] | None = None
    """A NodeMetric object (read by `nodemetric_object`)."""
    assigned_pods: list[AssignedPodInput] = []
    pod: kube.Pod | None = None
    node_qos: NodeQoSInput | None = msgspec.field(default=None, name="nodeQoS")


_RFC3339: Final = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)?")


def parse_time(text: str, where: str) -> float:
    """An RFC 3339 time (nanoseconds at most; no offset is UTC) as the float nearest to its exact value."""
    match = _RFC3339.fullmatch(text)
    try:
        if match is None:
            raise ValueError
        whole = dt.datetime.fromisoformat(match[1] + ("+00:00" if match[3] in (None, "Z") else match[3]))
    except ValueError:
        raise SnapshotError(f"{where}: {text!r} is not an RFC 3339 time") from None
    fraction = Fraction(int(match[2]), 10 ** len(match[2])) if match[2] else Fraction(0)
    return float(int(whole.timestamp()) + fraction)


def _written(seconds: Fraction, digits: int) -> str:
    scaled = round(seconds * 10**digits)
    whole, fraction = divmod(scaled, 10**digits)
    text = (_EPOCH + dt.timedelta(seconds=whole)).replace(tzinfo=None).isoformat()  # four-digit years, 0001 too
    if fraction:
        text += f".{fraction:0{digits}d}".rstrip("0")
    return text + "Z"


def format_time(seconds: float) -> str:
    """RFC 3339 in UTC with `Z` and the fewest fractional digits (none when whole) that `parse_time` reads back as
    the same float: the text a document gave, and an exact copy of a time the extender holds."""
    exact = Fraction(seconds)
    for digits in range(10):
        text = _written(exact, digits)
        if parse_time(text, "$") == seconds:
            return text
    return _written(exact, 9)


def _seconds_text(seconds: Fraction | float) -> str:
    """A duration in seconds as a JSON key: "300", or "1.5" when not whole."""
    value = Fraction(seconds)
    return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"


# --- reading


def read_args(document: Mapping[str, Any] | None) -> LoadAwareArgs:
    """The document's args defaulted and checked; ArgsError (Koordinator rejects them) or its ArgsFormatError
    subclass (not args at all)."""
    args = with_defaults(convert_args(document, source="$.args"))
    check_args(args)
    return args


def _resource_map(value: Any) -> Any:
    """Koordinator writes a ResourceMap as `{"resources": {...}, "devices": [...]}`; a ResourceList given inline
    (`{"cpu": "4"}`, as hand-written documents and the shared vectors do) is read as its `resources`."""
    if isinstance(value, dict) and value and "resources" not in value and "devices" not in value:
        return {"resources": value}
    return value


def _normalized(document: dict[str, Any]) -> dict[str, Any]:
    """The NodeMetric with every ResourceMap the extender reads in Koordinator's form (a copy; the rest as given)."""
    status = document.get("status")
    if not isinstance(status, dict):
        return document
    status = dict(status)
    info = status.get("nodeMetric")
    if isinstance(info, dict):
        info = dict(info)
        for field in ("nodeUsage", "systemUsage"):
            if field in info:
                info[field] = _resource_map(info[field])
        usages = info.get("aggregatedNodeUsages")
        if isinstance(usages, list):
            info["aggregatedNodeUsages"] = [
                {**u, "usage": {k: _resource_map(v) for k, v in u["usage"].items()}}
                if isinstance(u, dict) and isinstance(u.get("usage"), dict)
                else u
                for u in usages
            ]
        status["nodeMetric"] = info
    pods = status.get("podsMetric")
    if isinstance(pods, list):
        status["podsMetric"] = [
            {**pod, "podUsage": _resource_map(pod["podUsage"])} if isinstance(pod, dict) and "podUsage" in pod else pod
            for pod in pods
        ]
    return {**document, "status": status}


def nodemetric_object(document: dict[str, Any], *, path: str = "$.nodeMetric") -> nodemetric_json.NodeMetricObject:
    """A NodeMetric object from its JSON; SnapshotError naming the field when it is not one."""
    try:
        return msgspec.convert(_normalized(document), nodemetric_json.NodeMetricObject)
    except msgspec.ValidationError as err:
        message, _, where = str(err).rpartition(" - at `")
        if not message:
            raise SnapshotError(f"{path}: {err}") from None
        where = where.rstrip("`")
        if message.startswith("."):  # a quantity checked by its struct: ".resources.cpu: cannot parse …"
            relative, _, message = message.partition(": ")
            where += relative
        raise SnapshotError(f"{path}{where[1:]}: {message}") from None


def metric_view_of(obj: nodemetric_json.NodeMetricObject, *, update_time: float | None) -> state.MetricView:
    """A NodeMetric object as Koordinator's podAssignCache reads it: a present `status.nodeMetric` gives a node
    usage (an empty one is zeros), podsMetric entries without usage are skipped, no updateTime is Go's zero time."""
    status = obj.status
    info = status.node_metric
    aggregated: dict[state.AggregationKey, resources.ResourceList] = {}
    if info is not None:
        entries = []
        for i, usage in enumerate(info.aggregated_node_usages or ()):
            try:
                seconds = koordinator.parse_go_duration(usage.duration) if usage.duration else Fraction(0)
            except ValueError as err:
                where = f"$.nodeMetric.status.nodeMetric.aggregatedNodeUsages[{i}].duration"
                raise SnapshotError(f"{where}: {err}") from None
            amounts = {kind: kube.resource_amounts(rm.resources) for kind, rm in (usage.usage or {}).items()}
            entries.append((seconds, amounts))
        aggregated = state.aggregated_usages(entries)
    usages, prod = state.pod_usages(
        (f"{p.namespace}/{p.name}", kube.resource_amounts(p.pod_usage.resources), p.priority)
        for p in status.pods_metric or ()
        if p is not None
    )
    policy = obj.spec.metric_collect_policy
    interval = policy.report_interval_seconds if policy is not None else None
    missing = obj.metadata.annotations.get(NODE_USAGE_MISSING_ANNOTATION) == "true"
    return state.MetricView(
        update_time=update_time,
        report_interval=float(state.DEFAULT_REPORT_INTERVAL if interval is None else interval),
        node_usage=None if info is None or missing else kube.resource_amounts(info.node_usage.resources),
        system_usage=kube.resource_amounts(info.system_usage.resources) if info is not None else {},
        aggregated=aggregated,
        pod_usages=usages,
        prod_pods=prod,
        has_node_metric=info is not None,
    )


def _config(node_qos: NodeQoSInput | None) -> watermarks.WatermarkConfig | None:
    """The node QoS strategy given, as the service's WatermarkConfig would hold it (None: no strategies)."""
    if node_qos is None:
        return None
    config = watermarks.read_watermarks(
        {
            watermarks.THRESHOLD_KEY: json.dumps({"clusterStrategy": node_qos.resource_threshold_strategy}),
            watermarks.WATERMARKS_KEY: json.dumps({"avoidEvictionLoops": node_qos.avoid_eviction_loops}),
        }
    )
    if config.errors:
        raise SnapshotError(f"$.nodeQoS.resourceThresholdStrategy: {'; '.join(config.errors.values())}")
    return config


def _pod_key(pod: kube.Pod) -> str:
    return pod.metadata.uid or kube.pod_key(pod)


def read(document: NodeStateInput) -> tuple[state.LoadState, str, float]:
    """(the state, the node's name, now). ArgsError when Koordinator rejects the args; SnapshotError when the
    document is malformed."""
    args = read_args(document.args)
    now = parse_time(document.now, "$.now")
    name = document.node.metadata.name
    load = state.LoadState(args, _config(document.node_qos))
    load.apply_node(name, document.node)
    if document.node_metric is not None:
        obj = nodemetric_object(document.node_metric)
        status = document.node_metric.get("status")
        text = status.get("updateTime") if isinstance(status, dict) else None
        update_time = parse_time(text, "$.nodeMetric.status.updateTime") if isinstance(text, str) else None
        load.set_metric(name, metric_view_of(obj, update_time=update_time))
    latest: dict[str, tuple[kube.Pod, float]] = {}
    for i, entry in enumerate(document.assigned_pods):
        seen = now if entry.assigned_at is None else parse_time(entry.assigned_at, f"$.assignedPods[{i}].assignedAt")
        latest.pop(_pod_key(entry.pod), None)  # a later entry of the same pod replaces the earlier one
        latest[_pod_key(entry.pod)] = (entry.pod, seen)
    for key, (pod, seen) in latest.items():
        if name and pod.spec.node_name == name:
            load.apply_pod(key, pod, node=name, seen_at=seen)
    return load, name, now


# --- deciding


def _vector_or_none(amounts: Mapping[str, int] | None, vector: tuple[str, ...]) -> dict[str, int] | None:
    return None if amounts is None else core.on_vector(amounts, vector)


def _display(key: str) -> str:
    """namespace/name, or the name alone for a pod without namespace."""
    return key.removeprefix("/")


def cache(load: state.LoadState, node: str) -> dict[str, Any]:
    """The node's podAssignCache entry (CALC-CONTRACT `cache`): its pods, and the NodeMetric sums (null without a
    NodeMetric)."""
    vector = load.vector
    entry = load.nodes.get(node)
    pods = sorted(entry.pods.values(), key=lambda p: _display(p.key)) if entry else []
    out: dict[str, Any] = {
        "pods": [
            {
                "pod": _display(pod.key),
                "timestamp": format_time(pod.timestamp),
                "estimated": core.on_vector(pod.estimated, vector)
                if any(pod.estimated.get(name) for name in vector)
                else None,
                "estimatedDeadline": None if pod.deadline is None else format_time(pod.deadline),
            }
            for pod in pods
        ]
    }
    metric = entry.metric if entry else None
    node_load = load.load_of(node)
    fields = (
        "nodeUsage", "prodUsage", "nodeDelta", "prodDelta", "nodeEstimated", "nodeDeltaPods", "prodDeltaPods",
        "nodeEstimatedPods", "aggUsages", "updateTime", "reportIntervalSeconds",
    )  # fmt: skip
    if metric is None or node_load is None:
        return out | dict.fromkeys(fields)
    aggregated: dict[str, dict[str, dict[str, int]]] = {}
    for (kind, seconds), amounts in sorted(metric.aggregated.items()):
        aggregated.setdefault(kind, {})[_seconds_text(seconds)] = core.on_vector(amounts, vector)
    interval = metric.report_interval
    return out | {
        "nodeUsage": _vector_or_none(metric.node_usage, vector),
        "prodUsage": core.on_vector(node_load.prod_usage, vector),
        "nodeDelta": core.on_vector(node_load.node_delta, vector),
        "prodDelta": core.on_vector(node_load.prod_delta, vector),
        "nodeEstimated": core.on_vector(node_load.node_estimated, vector),
        "nodeDeltaPods": sorted({_display(k) for k in node_load.node_delta_pods}),
        "prodDeltaPods": sorted({_display(k) for k in node_load.prod_delta_pods}),
        "nodeEstimatedPods": sorted({_display(k) for k in node_load.node_estimated_pods}),
        "aggUsages": aggregated,
        "updateTime": GO_ZERO_TIME if metric.update_time is None else format_time(metric.update_time),
        "reportIntervalSeconds": int(interval) if interval.is_integer() else interval,
    }


def decide(load: state.LoadState, node: str, pod: kube.Pod, *, now: float) -> dict[str, Any]:
    """The filter status and Koordinator's reason, the 0–100 score, the estimates they compared and the node's
    cache; `explain` carries the arithmetic (core.explain)."""
    incoming = core.incoming(pod, load.args)
    verdict = core.filter_node(load, incoming, node, now=now, explain=True)
    score = core.score_node(load, incoming, node, now=now, explain=True)
    return {
        "filter": {
            "status": "Success" if verdict.passed else "Unschedulable",
            "reason": "" if verdict.passed else verdict.reason,
        },
        "score": score.score,
        "estimated": {"filter": verdict.estimated, "score": score.estimated},
        "cache": cache(load, node),
        "explain": core.explain(load, pod, node, now=now),
    }


# --- writing


def _resource_list(amounts: Mapping[str, int]) -> dict[str, str]:
    return quantity.format_resource_list(amounts)


def _overrides_annotation(overrides: state.Overrides) -> str:
    document: dict[str, Any] = {
        "usageThresholds": dict(overrides.usage_thresholds),
        "prodUsageThresholds": dict(overrides.prod_usage_thresholds),
    }
    if overrides.aggregation_type:
        document["aggregatedUsage"] = {
            "usageThresholds": dict(overrides.aggregated_thresholds),
            "usageAggregationType": overrides.aggregation_type,
            "usageAggregatedDuration": koordinator.format_go_duration(overrides.aggregated_seconds),
        }
    return json.dumps(document, sort_keys=True)


def _nodemetric_object(node: str, metric: state.MetricView) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if metric.update_time is not None:
        status["updateTime"] = format_time(metric.update_time)
    if metric.has_node_metric:
        positive = {kind for kind, seconds in metric.aggregated if seconds > 0}
        by_duration: dict[Fraction, dict[str, Any]] = {}
        for (kind, seconds), amounts in sorted(metric.aggregated.items()):
            if seconds > 0 or kind not in positive:  # (type, 0) is the longest one, unless reported as such
                by_duration.setdefault(seconds, {})[kind] = {"resources": _resource_list(amounts)}
        status["nodeMetric"] = {
            "nodeUsage": {"resources": _resource_list(metric.node_usage or {})},
            "systemUsage": {"resources": _resource_list(metric.system_usage)},
            "aggregatedNodeUsages": [
                {"duration": koordinator.format_go_duration(seconds), "usage": usage}
                for seconds, usage in sorted(by_duration.items())
            ],
        }
    status["podsMetric"] = [
        {
            "namespace": key.partition("/")[0],
            "name": key.partition("/")[2],
            "podUsage": {"resources": _resource_list(usage)},
            "priority": vocab.PRIORITY_PROD if key in metric.prod_pods else "",
        }
        for key, usage in sorted(metric.pod_usages.items())
    ]
    metadata: dict[str, Any] = {"name": node}
    if metric.has_node_metric and metric.node_usage is None:
        metadata["annotations"] = {NODE_USAGE_MISSING_ANNOTATION: "true"}
    return {
        "apiVersion": koordinator.API_VERSION,
        "kind": koordinator.KIND_NODEMETRIC,
        "metadata": metadata,
        "spec": {"metricCollectPolicy": {"reportIntervalSeconds": round(metric.report_interval)}},
        "status": status,
    }


def _assigned(node: str, pod: state.AssignedPod) -> dict[str, Any]:
    if pod.source:
        shown: dict[str, Any] = json.loads(pod.source)
    else:  # an entry not built from a pod (tests, the benchmark): its identity only
        namespace, _, name = pod.key.partition("/")
        shown = {"metadata": {"namespace": namespace, "name": name}}
    shown.setdefault("spec", {})["nodeName"] = node  # counted here, also when assumed before the watch saw it
    return {"pod": shown, "assignedAt": format_time(pod.timestamp)}


def export(load: state.LoadState, node: str, *, now: float) -> dict[str, Any] | None:
    """The node's state as `read` takes it (without the incoming `pod`); None for a node the state does not know.
    Reading it back gives the same filter and score for any pod at `now`."""
    entry = load.nodes.get(node)
    if entry is None:
        return None
    args = to_json(load.args)
    if not load.args.usage_thresholds:  # {} would be defaulted back to 65/95: say "nothing checked" explicitly
        args["usageThresholds"] = {resources.CPU: 0}
    node_object: dict[str, Any] = {"metadata": {"name": node}}
    if entry.labels:
        node_object["metadata"]["labels"] = dict(entry.labels)
    if entry.overrides is not None:
        node_object["metadata"]["annotations"] = {
            state.ANNOTATION_USAGE_THRESHOLDS: _overrides_annotation(entry.overrides)
        }
    if entry.allocatable is not None:
        node_object["status"] = {"allocatable": _resource_list(entry.allocatable)}
    document: dict[str, Any] = {
        "now": format_time(now),
        "args": args,
        "node": node_object,
        "nodeMetric": None if entry.metric is None else _nodemetric_object(node, entry.metric),
        "assignedPods": [_assigned(node, pod) for pod in sorted(entry.pods.values(), key=lambda p: p.key)],
    }
    strategy = load.qos_strategies[entry.qos_strategy]
    if load.avoid_eviction_loops and strategy.get("enable"):
        document["nodeQoS"] = {"resourceThresholdStrategy": dict(strategy), "avoidEvictionLoops": True}
    return document


def decode(data: bytes | str) -> NodeStateInput:
    """A JSON document as NodeStateInput; msgspec.ValidationError / DecodeError when it is not one."""
    return msgspec.json.decode(data, type=NodeStateInput)


__all__ = ["ArgsError", "NodeStateInput", "SnapshotError", "cache", "decide", "decode", "export", "read"]
