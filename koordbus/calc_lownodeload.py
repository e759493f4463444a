"""`koordbus calc low-node-load` and `koordbus calc low-node-load-util` (../shared/design/CALC-CONTRACT.md, spec §11).

Registered in koordbus.calc.CALCULATORS through `LOW_NODE_LOAD` and `LOW_NODE_LOAD_UTIL`. `low-node-load` decodes
one Balance round's input (args, nodes, NodeMetrics, pods, eviction limits, detector states), runs
services.migration.lownodeload_balance and renders the classes, the evictions with their reasons, the pools and
the detectors after the round. `low-node-load-util` runs one helper of services.migration.lownodeload_util (or the
anomaly detector) on its own, as Koordinator's unit tests call them. Resource maps are read as Kubernetes
ResourceLists; a NodeMetric ResourceMap may be written as `{"resources": {...}}` (Koordinator's JSON) or inline.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from fractions import Fraction
from typing import Any, Literal

import msgspec

from koordbus.calc_errors import InputError
from koordbus.calc_kind import Calculator
from schemas import kube, quantity, resources
from schemas.koordinator import parse_go_duration
from schemas.scheduling import SchedulingNode, SchedulingPod, label_selector_error
from schemas.selectors import LabelSelector
from services.migration import anomaly
from services.migration import lownodeload_balance as balance
from services.migration import lownodeload_util as util
from services.migration.lownodeload_args import AnomalyCondition, LowNodeLoadArgsJSON, error_message, resolve

# --- decoding


class PodMetricJSON(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    namespace: str = ""
    name: str = ""
    pod_usage: dict[str, Any] | None = None


class NodeMetricInfoJSON(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    system_usage: dict[str, Any] | None = None


class NodeMetricStatusJSON(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    update_time: dt.datetime | None = None
    node_metric: NodeMetricInfoJSON | None = None
    pods_metric: list[PodMetricJSON | None] | None = None


class NodeMetricJSON(msgspec.Struct, frozen=True, kw_only=True):
    metadata: kube.ObjectMeta = kube.ObjectMeta()
    status: NodeMetricStatusJSON = NodeMetricStatusJSON()


class LimitsJSON(msgspec.Struct, frozen=True, kw_only=True):
    """The descheduler's eviction limits, under their v1alpha2 names."""

    maxNoOfPodsToEvictPerNode: int | None = None
    maxNoOfPodsToEvictPerNamespace: int | None = None
    maxNoOfPodsToEvictTotal: int | None = None


class DetectorJSON(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    state: Literal["ok", "anomaly"] = "ok"
    abnormal: int = 0
    normal: int = 0
    anomaly_until: dt.datetime | None = None


class LowNodeLoadInput(msgspec.Struct, kw_only=True, rename="camel"):
    now: dt.datetime
    args: LowNodeLoadArgsJSON | None = None
    nodes: list[SchedulingNode] = []
    node_metrics: list[NodeMetricJSON] = []
    pods: list[SchedulingPod] = []
    limits: LimitsJSON | None = None
    anomaly_state: dict[str, DetectorJSON] | None = None
    prod_anomaly_state: dict[str, DetectorJSON] | None = None


def resource_map(raw: Any, path: str) -> util.Amounts:
    """A ResourceList (or a NodeMetric ResourceMap, `{"resources": …}`) as exact amounts; InputError naming the bad
    quantity."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise InputError(f"{path}: Expected `object`, got `{type(raw).__name__}`")
    if isinstance(raw.get("resources"), Mapping):
        raw, path = raw["resources"], f"{path}.resources"
    out: util.Amounts = {}
    for name, value in raw.items():
        if name == "devices" and not isinstance(value, (str, int, float)):
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise InputError(f"{path}.{name}: Expected a quantity, got {value!r}")
        try:
            out[name] = quantity.parse_quantity(value).value
        except quantity.QuantityError as err:
            raise InputError(f"{path}.{name}: {err}") from None
    return out


def _metric_view(metric: NodeMetricJSON, path: str) -> balance.NodeMetricView:
    status = metric.status
    info = status.node_metric
    pods = [
        (f"{entry.namespace}/{entry.name}", resource_map(entry.pod_usage, f"{path}.status.podsMetric[{i}].podUsage"))
        for i, entry in enumerate(status.pods_metric or [])
        if entry is not None
    ]
    return balance.NodeMetricView(
        update_time=None if status.update_time is None else util.seconds(status.update_time),
        has_node_metric=info is not None,
        system_usage=resource_map(info.system_usage if info else None, f"{path}.status.nodeMetric.systemUsage"),
        pods=pods,
    )


def _detectors(
    states: Mapping[str, DetectorJSON] | None, condition: AnomalyCondition | None, now: Fraction
) -> dict[str, anomaly.Detector]:
    """The detectors as given, with the default pool's condition (a given anomaly without an end lasts the timeout)."""
    out = {}
    for name, state in (states or {}).items():
        abnormalities = condition.consecutive_abnormalities if condition else 5
        normalities = condition.consecutive_normalities if condition else 3
        timeout = condition.timeout_seconds if condition else Fraction(0)
        detector = anomaly.Detector(abnormalities, normalities, timeout, state.state, state.abnormal, state.normal)
        if state.state == anomaly.ANOMALY:
            until = state.anomaly_until
            detector.anomaly_until = now + detector.effective_timeout() if until is None else util.seconds(until)
        out[name] = detector
    return out


def _detectors_out(detectors: Mapping[str, anomaly.Detector], now: Fraction) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, d in detectors.items():
        entry: dict[str, Any] = {"state": d.current_state(now), "abnormal": d.abnormal, "normal": d.normal}
        if d.state == anomaly.ANOMALY and d.anomaly_until is not None:
            moment = dt.datetime.fromtimestamp(float(d.anomaly_until), tz=dt.UTC)
            entry["anomalyUntil"] = moment.strftime("%Y-%m-%dT%H:%M:%SZ")
        out[name] = entry
    return out


def low_node_load(inp: LowNodeLoadInput) -> dict[str, Any]:
    try:
        args = resolve(inp.args or LowNodeLoadArgsJSON())
    except ValueError as err:
        raise InputError(f"$.args.{err}") from None
    if args.problems:
        return {"error": error_message(args.problems)}
    now = util.seconds(inp.now)
    metrics = {m.metadata.name: _metric_view(m, f"$.nodeMetrics[{i}]") for i, m in enumerate(inp.node_metrics)}
    limits = inp.limits or LimitsJSON()
    condition = args.pools[0].condition
    rnd = balance.Round(
        args=args,
        nodes=inp.nodes,
        metrics=metrics,
        pods_on=balance.pods_by_node(inp.pods),
        now=now,
        evictor=balance.Evictor(
            balance.Limits(
                limits.maxNoOfPodsToEvictPerNode, limits.maxNoOfPodsToEvictPerNamespace, limits.maxNoOfPodsToEvictTotal
            )
        ),
        detectors=_detectors(inp.anomaly_state, condition, now),
        prod_detectors=_detectors(inp.prod_anomaly_state, condition, now),
    )
    balance.balance(rnd)
    order = {n.metadata.name: i for i, n in enumerate(inp.nodes)}

    def merged(pick: Any) -> list[str]:
        names = {name for pool in rnd.pools for name in pick(pool)}
        return sorted(names, key=lambda name: order.get(name, len(order)))

    out: dict[str, Any] = {c: merged(lambda p, c=c: p.classes[c]) for c in balance.CLASSES}
    out["abnormalNodes"] = merged(lambda p: p.abnormal_nodes)
    out["abnormalProdNodes"] = merged(lambda p: p.abnormal_prod_nodes)
    out["evicted"] = [e.pod for e in rnd.evictions]
    out["evictedCount"] = len(rnd.evictions)
    out["evictions"] = [
        {"pod": e.pod, "node": e.node, "prod": e.prod, "pool": e.pool, "reason": e.reason} for e in rnd.evictions
    ]
    out["pools"] = [
        {
            "name": p.name,
            "nodes": p.nodes,
            **p.classes,
            "abnormalNodes": p.abnormal_nodes,
            "abnormalProdNodes": p.abnormal_prod_nodes,
        }
        for p in rnd.pools
    ]
    out["anomalyState"] = _detectors_out(rnd.detectors, now)
    out["prodAnomalyState"] = _detectors_out(rnd.prod_detectors, now)
    return out


# --- low-node-load-util


class AnomalyConditionLiteral(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    consecutive_abnormalities: int = 0
    consecutive_normalities: int = 0
    timeout: str | None = None


class AnomalyStep(msgspec.Struct, frozen=True, kw_only=True):
    op: Literal["filter", "reset", "markNormal"]
    nodes: list[str] = []


class UtilInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    op: Literal[
        "rawAllocatable",
        "resourceUsagePercentages",
        "sortNodesByUsage",
        "sortPods",
        "podFitsAnyNode",
        "evictionReason",
        "filterNodes",
        "anomaly",
    ]
    node: SchedulingNode | None = None
    nodes: list[dict[str, Any]] | None = None
    usage: dict[str, Any] | None = None
    prod_usage: dict[str, Any] | None = None
    resource_weights: dict[str, int] | None = None
    ascending: bool = False
    high_thresholds: dict[str, Any] | None = None
    prod_high_thresholds: dict[str, float] | None = None
    pod_metrics: list[PodMetricJSON] | None = None
    pods: list[SchedulingPod] | None = None
    pod: SchedulingPod | None = None
    node_usages: dict[str, dict[str, Any]] | None = None
    node_thresholds: dict[str, dict[str, Any]] | None = None
    prod: bool = False
    pod_metric: dict[str, Any] | None = None
    node_selector: LabelSelector | None = None
    processed: list[str] | None = None
    anomaly_condition: AnomalyConditionLiteral | None = None
    steps: list[AnomalyStep] | None = None


def _convert(value: Any, kind: Any, path: str) -> Any:
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as err:
        message, sep, where = str(err).rpartition(" - at `$")
        if not sep:
            raise InputError(f"{path}: {err}") from None
        raise InputError(f"{path}{where.rstrip('`')}: {message}") from None


def _int_amount(name: str, value: Fraction) -> int:
    """The contract's unit rule: cpu (and *-cpu, but batch-cpu/mid-cpu as written) in millicores, else Value()."""
    as_written = name.endswith(("batch-cpu", "mid-cpu"))
    return util.milli(value) if resources.is_milli_resource(name) and not as_written else util.whole(value)


def _ints(amounts: Mapping[str, Fraction]) -> dict[str, int]:
    return {name: _int_amount(name, value) for name, value in amounts.items()}


def _need_node(inp: UtilInput) -> SchedulingNode:
    if inp.node is None:
        raise InputError("$.node: required for op " + inp.op)
    return inp.node


def _float_percents(raw: Mapping[str, Any] | None, path: str) -> dict[str, float]:
    out = {}
    for name, value in (raw or {}).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(f"{path}.{name}: Expected `number`, got {value!r}")
        out[name] = float(value)
    return out


def _sort_pods(inp: UtilInput) -> dict[str, Any]:
    usage = resource_map(inp.usage, "$.usage")
    thresholds = resource_map(inp.high_thresholds, "$.highThresholds")
    metrics = {
        f"{m.namespace}/{m.name}": resource_map(m.pod_usage, f"$.podMetrics[{i}].podUsage")
        for i, m in enumerate(inp.pod_metrics or [])
    }
    exceeding = {name: usage[name] - thresholds[name] for name in util.over_resources(usage, thresholds)}
    ordered = util.sort_pods(inp.pods or [], metrics, exceeding, inp.resource_weights or {})
    return {"order": [kube.pod_key(p) for p in ordered]}


def _pod_fits(inp: UtilInput) -> dict[str, Any]:
    if inp.pod is None:
        raise InputError("$.pod: required for op podFitsAnyNode")
    nodes = [_convert(n, SchedulingNode, f"$.nodes[{i}]") for i, n in enumerate(inp.nodes or [])]
    usages = {n: resource_map(u, f"$.nodeUsages.{n}") for n, u in (inp.node_usages or {}).items()}
    thresholds = {n: resource_map(t, f"$.nodeThresholds.{n}") for n, t in (inp.node_thresholds or {}).items()}
    metric = resource_map(inp.pod_metric, "$.podMetric")
    fits = util.pod_fits_any_node(inp.pod, nodes, balance.pods_by_node(inp.pods or []), usages, thresholds, metric)
    return {"fits": fits, "nodeUsages": {n: _ints(u) for n, u in usages.items()}}


def _eviction_reason(inp: UtilInput) -> dict[str, Any]:
    node = _need_node(inp)
    allocatable = util.raw_allocatable(node)
    high = _float_percents(inp.high_thresholds, "$.highThresholds")
    prod_high = _float_percents(inp.prod_high_thresholds, "$.prodHighThresholds")
    percents = prod_high if inp.prod else high
    thresholds = {name: util.absolute_threshold(allocatable, name, percents.get(name, 0.0)) for name in high}
    usage = resource_map(inp.prod_usage if inp.prod else inp.usage, "$.prodUsage" if inp.prod else "$.usage")
    return {"reason": util.eviction_reason(inp.prod, high, prod_high, usage, thresholds, allocatable)}


def _filter_nodes(inp: UtilInput) -> dict[str, Any]:
    nodes = [_convert(n, SchedulingNode, f"$.nodes[{i}]") for i, n in enumerate(inp.nodes or [])]
    error = label_selector_error(inp.node_selector)
    if error:
        return {"error": error}
    kept = balance.filter_nodes(inp.node_selector, nodes, set(inp.processed or ()))
    return {"nodes": [n.metadata.name for n in kept]}


def _anomaly(inp: UtilInput) -> dict[str, Any]:
    condition = inp.anomaly_condition or AnomalyConditionLiteral()
    timeout = Fraction(0)
    if condition.timeout:
        try:
            timeout = parse_go_duration(condition.timeout)
        except ValueError:
            raise InputError(f"$.anomalyCondition.timeout: invalid duration {condition.timeout!r}") from None
    now = Fraction(0)
    detectors: dict[str, anomaly.Detector] = {}
    results = []
    for step in inp.steps or []:
        entry: dict[str, Any] = {}
        if step.op == "filter":
            entry["abnormalNodes"] = anomaly.filter_abnormal(
                step.nodes,
                detectors,
                condition.consecutive_abnormalities,
                condition.consecutive_normalities,
                timeout,
                now,
            )
        elif step.op == "reset":
            anomaly.reset_all(step.nodes, detectors, now)
        else:
            anomaly.mark_normal(step.nodes, detectors, now)
        entry["states"] = {name: d.current_state(now) for name, d in detectors.items()}
        results.append(entry)
    return {"results": results}


def low_node_load_util(inp: UtilInput) -> dict[str, Any]:
    if inp.op == "rawAllocatable":
        return {"allocatable": _ints(util.raw_allocatable(_need_node(inp)))}
    if inp.op == "resourceUsagePercentages":
        allocatable = util.raw_allocatable(_need_node(inp))
        return {"percentages": util.usage_percentages(resource_map(inp.usage, "$.usage"), allocatable)}
    if inp.op == "sortNodesByUsage":
        entries = []
        for i, entry in enumerate(inp.nodes or []):
            node = _convert(entry.get("node", {}), SchedulingNode, f"$.nodes[{i}].node")
            usage = resource_map(entry.get("usage"), f"$.nodes[{i}].usage")
            entries.append((node.metadata.name, usage, util.raw_allocatable(node)))
        weights = inp.resource_weights or {}
        return {"order": util.sort_nodes_by_usage(entries, weights, ascending=inp.ascending)}
    if inp.op == "sortPods":
        return _sort_pods(inp)
    if inp.op == "podFitsAnyNode":
        return _pod_fits(inp)
    if inp.op == "evictionReason":
        return _eviction_reason(inp)
    if inp.op == "filterNodes":
        return _filter_nodes(inp)
    return _anomaly(inp)


LOW_NODE_LOAD = Calculator(
    LowNodeLoadInput,
    low_node_load,
    "one Balance round of koord-descheduler's LowNodeLoad: node classes, abnormal nodes, evictions (spec §11)",
    '{"now": "2026-01-01T12:00:00Z", "args": {"lowThresholds": {"cpu": 30}, "highThresholds": {"cpu": 50},\n'
    '       "anomalyCondition": {"consecutiveAbnormalities": 1}},\n'
    '     "nodes": [{"metadata": {"name": "hot"}, "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}}},\n'
    '               {"metadata": {"name": "cold"}, "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}}}],\n'
    '     "nodeMetrics": [{"metadata": {"name": "hot"}, "status": {"updateTime": "2026-01-01T12:00:00Z",\n'
    '         "nodeMetric": {"systemUsage": {"cpu": "1500m"}},\n'
    '         "podsMetric": [{"namespace": "ns", "name": "web", "podUsage": {"cpu": "1500m"}}]}},\n'
    '       {"metadata": {"name": "cold"}, "status": {"updateTime": "2026-01-01T12:00:00Z", "nodeMetric": {}}}],\n'
    '     "pods": [{"metadata": {"namespace": "ns", "name": "web", "ownerReferences": [{"kind": "ReplicaSet"}]},\n'
    '               "spec": {"nodeName": "hot"}}]}',
)
LOW_NODE_LOAD_UTIL = Calculator(
    UtilInput,
    low_node_load_util,
    "one LowNodeLoad helper: rawAllocatable, resourceUsagePercentages, sortNodesByUsage, sortPods, podFitsAnyNode,"
    " evictionReason, filterNodes, anomaly (spec §11)",
    '{"op": "rawAllocatable", "node": {"metadata": {"annotations":\n'
    '       {"node.koordinator.sh/raw-allocatable": "{\\"cpu\\": \\"8\\"}"}},\n'
    '       "status": {"allocatable": {"cpu": "32"}}}}',
)
