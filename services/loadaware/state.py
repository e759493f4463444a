"""Per-node state of the load-aware extender (spec §6.4, Koordinator's podAssignCache + NodeMetric lister). Pure.

`LoadState` is folded from NodeObserved/PodObserved (KOORD_CLUSTER) and NodeMetricComputed (KOORD_NODEMETRIC)
events by the service; nothing here reads a clock. Per node it keeps the allocatable (EstimateNode), the
usage-thresholds annotation, the last NodeMetric as a `MetricView`, and the assigned pods as `AssignedPod`
(estimate, assign timestamp, estimation deadline). `node_load` is Koordinator's addPod loop over those pods; its
result depends only on the NodeMetric and the pods, so it is cached per node until either changes. Each node also
carries its labels and the index of the resource-threshold strategy node QoS applies to it (`apply_config` sets the
slo-controller-config's watermarks and strategies, services.common.watermarks); core caps thresholds with it.

Bind-time accounting (user-asks #7): a pod counts from the moment its PodObserved carries a nodeName (its
timestamp is the PodScheduled transition, else the time the bridge saw it), and `assume` records a placement the
extender's `bind` or `assume` verb reports before any watch event; the watch event then replaces it, and a bind that
failed takes it back with `forget_assumed`. A placement no watch event confirms counts for `assumed_ttl_seconds`
(ASSUMED_TTL_SECONDS by default) and is then forgotten by `expire_assumed` (the extender calls it with `now` at each
verb): a pod the scheduler assumed but never bound, or a placement a caller invented, cannot hold a node's capacity.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Final

from schemas import koordinator, kube, resources, vocab
from schemas.node import NodeMetricComputed
from services.common import gojson, watermarks
from services.loadaware import estimator, source
from services.loadaware.args import LoadAwareArgs

ANNOTATION_USAGE_THRESHOLDS: Final = "scheduling.koordinator.sh/usage-thresholds"
DEFAULT_REPORT_INTERVAL: Final = 60.0
ASSUMED_TTL_SECONDS: Final = 30.0
"""How long an assumed placement counts without a watch event showing the pod on its node (the bridge publishes a
bound pod within seconds)."""

ResourceList = resources.ResourceList


AggregationKey = tuple[str, Fraction]
"""(aggregation type, duration in seconds); duration 0 is the longest one the NodeMetric reports for the type."""


@dataclass(frozen=True, slots=True)
class MetricView:
    """What the extender reads of one NodeMetric: amounts by resource, aggregated usages by (type, seconds) with
    (type, 0) the longest duration of that type, pod usages by namespace/name, the pods reported as prod.

    `node_usage` None: there is no usage to start from (`status.nodeMetric` absent, or our report's empty usage;
    see `metric_view`). `update_time` None: the status carries none (the NodeMetric counts as expired)."""

    update_time: float | None
    report_interval: float
    node_usage: ResourceList | None
    system_usage: ResourceList
    aggregated: Mapping[AggregationKey, ResourceList]
    pod_usages: Mapping[str, ResourceList]
    prod_pods: frozenset[str]
    has_node_metric: bool = True
    """`status.nodeMetric` is present (Koordinator's filter and score skip a NodeMetric without it)."""


def aggregated_usages(
    entries: Iterable[tuple[Fraction, Mapping[str, ResourceList]]],
) -> dict[AggregationKey, ResourceList]:
    """Koordinator's aggUsages: every non-empty (type, duration) usage, later entries replacing earlier ones, then
    (type, 0) = the usage of the longest positive duration of each type."""
    aggregated: dict[AggregationKey, ResourceList] = {}
    longest: dict[str, Fraction] = {}
    for duration, usages in entries:
        for kind, amounts in usages.items():
            if not amounts:
                continue  # an empty ResourceMap is "no data"
            aggregated[(kind, duration)] = dict(amounts)
            if duration > longest.get(kind, 0):
                longest[kind] = duration
    for kind, duration in longest.items():
        aggregated[(kind, Fraction(0))] = aggregated[(kind, duration)]
    return aggregated


def pod_usages(entries: Iterable[tuple[str, ResourceList, str]]) -> tuple[dict[str, ResourceList], frozenset[str]]:
    """(usage by namespace/name, the keys reported as koord-prod) from podsMetric entries (key, usage, priority);
    an entry without usage is skipped, as Koordinator does."""
    usages: dict[str, ResourceList] = {}
    prod: set[str] = set()
    for key, usage, priority in entries:
        if not usage:
            continue
        usages[key] = dict(usage)
        if priority == vocab.PRIORITY_PROD:
            prod.add(key)
    return usages, frozenset(prod)


def metric_view(event: NodeMetricComputed) -> MetricView:
    """Our NodeMetricComputed as the extender reads it. An empty node usage is "no data" (our ResourceMap's
    convention, a deliberate difference from Koordinator, which reads it as zeros): the estimate then starts from
    the assigned pods' estimates, so a node whose agent reported nothing does not look idle."""
    info = event.status.node_metric
    usages, prod = pod_usages(
        (f"{p.namespace}/{p.name}", p.pod_usage.resources, p.priority) for p in event.status.pods_metric
    )
    return MetricView(
        update_time=event.status.update_time,
        report_interval=float(event.spec.report_interval_seconds or DEFAULT_REPORT_INTERVAL),
        node_usage=dict(info.node_usage.resources) or None,
        system_usage=dict(info.system_usage.resources),
        aggregated=aggregated_usages(
            (Fraction(u.duration_seconds), {k: rm.resources for k, rm in u.usage.items()})
            for u in info.aggregated_node_usages
        ),
        pod_usages=usages,
        prod_pods=prod,
    )


@dataclass(frozen=True, slots=True)
class AssignedPod:
    key: str
    """namespace/name, how NodeMetric names it."""
    estimated: ResourceList
    timestamp: float
    """PodScheduled's lastTransitionTime when True, else when the assignment was seen."""
    deadline: float | None
    """Until when the estimate counts even if NodeMetric already reports the pod; None: no such window."""
    prod: bool
    dated_by_condition: bool = False
    """`timestamp` is the PodScheduled transition (not when the assignment was seen)."""
    deadline_after: int | None = None
    """Seconds after `timestamp` the deadline is, when it derives from it (the after-PodScheduled window)."""
    source: bytes = b""
    """The pod as the extender reads it (services.loadaware.source): what the state export shows."""


def _condition_time(pod: kube.Pod, kind: str) -> float | None:
    for condition in pod.status.conditions or ():
        if condition.type == kind and condition.status == "True" and condition.last_transition_time is not None:
            return condition.last_transition_time.timestamp()
    return None


def assigned_pod(pod: kube.Pod, *, seen_at: float, args: LoadAwareArgs) -> AssignedPod:
    """The cache entry of a pod with a nodeName (spec §6.4): its estimate, the PodScheduled transition (else
    `seen_at`) as its timestamp, and the deadline of its estimation window — after Initialized when that window is
    set and the condition is True, else after the timestamp."""
    scheduled = _condition_time(pod, "PodScheduled")
    timestamp = seen_at if scheduled is None else scheduled
    after_scheduled, after_initialized = estimator.estimation_windows(pod, args)
    deadline: float | None = None
    deadline_after: int | None = None
    initialized = _condition_time(pod, "Initialized")
    if after_initialized > 0 and initialized is not None:
        deadline = initialized + after_initialized
    elif after_scheduled > 0:
        deadline, deadline_after = timestamp + after_scheduled, after_scheduled
    return AssignedPod(
        key=kube.pod_key(pod),
        estimated=estimator.estimate_pod(pod, args),
        timestamp=timestamp,
        deadline=deadline,
        prod=kube.pod_priority_class(pod) == vocab.PRIORITY_PROD,
        dated_by_condition=scheduled is not None,
        deadline_after=deadline_after,
        source=source.encode(pod),
    )


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """Koordinator's addPod sums over a node's assigned pods against its NodeMetric, and the pods in each."""

    node_delta: ResourceList
    """Estimates of pods the NodeMetric does not show yet (or shows for less than their estimate)."""
    node_estimated: ResourceList
    """Estimates of every assigned pod (the fallback when the NodeMetric has no usage to start from)."""
    prod_usage: ResourceList
    prod_delta: ResourceList
    node_delta_pods: tuple[str, ...] = ()
    prod_delta_pods: tuple[str, ...] = ()
    node_estimated_pods: tuple[str, ...] = ()


def node_load(
    metric: MetricView, pods: Iterable[AssignedPod], *, include_sys: bool, vector: Collection[str] | None = None
) -> NodeLoad:
    """addPod for each pod. A pod whose estimate is zero on every resource of `vector` (every resource when None)
    has no estimate: only its usage counts, toward prod usage. Sums accumulate in place: this runs for every pod of
    a node whenever the node's NodeMetric or pods change."""
    node_delta: ResourceList = {}
    node_estimated: ResourceList = {}
    prod_usage: ResourceList = dict(metric.system_usage) if include_sys else {}
    prod_delta: ResourceList = {}
    node_delta_pods: list[str] = []
    prod_delta_pods: list[str] = []
    node_estimated_pods: list[str] = []
    names = None if vector is None else frozenset(vector)
    update_time = -math.inf if metric.update_time is None else metric.update_time
    since = update_time - metric.report_interval
    for pod in pods:
        usage = metric.pod_usages.get(pod.key)
        active_prod = pod.prod and pod.key in metric.prod_pods
        if active_prod and usage is not None:
            _add(prod_usage, usage)
        estimated = pod.estimated
        if names is not None and not estimated.keys() <= names:
            estimated = {name: amount for name, amount in estimated.items() if name in names and amount}
        if not estimated:
            continue
        should = usage is None or pod.timestamp > since or (pod.deadline is not None and pod.deadline > update_time)
        if should and _add_above(node_delta, estimated, usage):
            node_delta_pods.append(pod.key)
        _add(node_estimated, estimated)
        node_estimated_pods.append(pod.key)
        if pod.prod:
            if not active_prod and usage is not None:
                usage, should = None, True
            if should and _add_above(prod_delta, estimated, usage):
                prod_delta_pods.append(pod.key)
    return NodeLoad(
        node_delta=node_delta,
        node_estimated=node_estimated,
        prod_usage=prod_usage,
        prod_delta=prod_delta,
        node_delta_pods=tuple(node_delta_pods),
        prod_delta_pods=tuple(prod_delta_pods),
        node_estimated_pods=tuple(node_estimated_pods),
    )


def _add(total: ResourceList, amounts: Mapping[str, int]) -> None:
    for name, amount in amounts.items():
        total[name] = total.get(name, 0) + amount


def _add_above(total: ResourceList, estimated: Mapping[str, int], usage: Mapping[str, int] | None) -> bool:
    """total += max(estimated − usage, 0) per resource of the estimate (all of it without usage); whether some
    resource grew (Koordinator's AddDelta)."""
    grew = False
    for name, amount in estimated.items():
        delta = amount if usage is None else amount - usage.get(name, 0)
        if delta > 0:
            total[name] = total.get(name, 0) + delta
            grew = True
        else:
            total.setdefault(name, 0)
    return grew


@dataclass(frozen=True, slots=True)
class Overrides:
    """The node's usage-thresholds annotation: each non-empty section replaces the plugin's profile."""

    usage_thresholds: Mapping[str, int] = field(default_factory=dict)
    prod_usage_thresholds: Mapping[str, int] = field(default_factory=dict)
    aggregated_thresholds: Mapping[str, int] = field(default_factory=dict)
    aggregation_type: str = ""
    """Set (with thresholds): the annotation's aggregated section replaces the plugin's; any type is taken."""
    aggregated_seconds: Fraction = Fraction(0)
    """0 when the section gives no duration: the longest one (not the plugin's duration)."""


_CUSTOM_USAGE_THRESHOLDS: Final = {
    "usageThresholds": "int64-map",
    "prodUsageThresholds": "int64-map",
    "aggregatedUsage": {
        "usageThresholds": "int64-map",
        "usageAggregationType": "string",
        "usageAggregatedDuration": "string-pointer",
    },
}
"""Koordinator's CustomUsageThresholds (apis/extension/load_aware.go) as services.common.gojson decodes it; the duration
is a metav1.Duration, parsed below."""


def parse_overrides(raw: str | None) -> tuple[Overrides | None, str]:
    """The annotation as Koordinator's GetCustomUsageThresholds reads it (Go's encoding/json, services.common.gojson),
    or None and why not (empty reason: no annotation, or `null`). A value of the wrong type or a duration that does
    not parse makes the whole annotation ignored; an aggregated section without thresholds or type is dropped
    (sections left empty change nothing)."""
    if raw is None:
        return None, ""
    problems: list[gojson.Problem] = []
    try:
        decoded = gojson.decode_onto(gojson.UNSET, gojson.parse(raw), _CUSTOM_USAGE_THRESHOLDS, "$", problems)
    except gojson.GoJsonError as err:
        return None, f"{ANNOTATION_USAGE_THRESHOLDS}: {err}"
    if problems:
        return None, f"{ANNOTATION_USAGE_THRESHOLDS}: {problems[0]}"
    if decoded is gojson.UNSET:
        return None, ""
    agg = decoded.get("aggregatedUsage", gojson.UNSET)
    agg = {} if agg is gojson.UNSET else agg
    thresholds, kind = agg.get("usageThresholds", {}), agg.get("usageAggregationType", "")
    seconds = Fraction(0)
    if (duration := agg.get("usageAggregatedDuration", gojson.UNSET)) is not gojson.UNSET:
        try:
            seconds = koordinator.parse_go_duration(duration)
        except ValueError as err:
            return None, f"{ANNOTATION_USAGE_THRESHOLDS}: $.aggregatedUsage.usageAggregatedDuration: {err}"
    if not thresholds or not kind:
        thresholds, kind, seconds = {}, "", Fraction(0)
    return Overrides(
        usage_thresholds=decoded.get("usageThresholds", {}),
        prod_usage_thresholds=decoded.get("prodUsageThresholds", {}),
        aggregated_thresholds=thresholds,
        aggregation_type=kind,
        aggregated_seconds=seconds,
    ), ""


@dataclass(slots=True)
class NodeEntry:
    allocatable: ResourceList | None = None
    overrides: Overrides | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    qos_strategy: int = 0
    """Which resource-threshold strategy node QoS applies here (services.common.watermarks.strategy_index)."""
    metric: MetricView | None = None
    pods: dict[str, AssignedPod] = field(default_factory=dict)
    """By the key the caller gives (the service: namespace/name, like the pod's KOORD_CLUSTER subject)."""
    load: NodeLoad | None = None
    """node_load of metric and pods, None until asked or after either changed."""


class LoadState:
    """Every node's entry, and which node each assigned pod is on. Mutated only through the apply methods."""

    def __init__(
        self,
        args: LoadAwareArgs,
        config: watermarks.WatermarkConfig | None = None,
        *,
        assumed_ttl_seconds: float = ASSUMED_TTL_SECONDS,
    ) -> None:
        self.args = args
        self.assumed_ttl_seconds = assumed_ttl_seconds
        self.vector = args.vector()
        self.config = config or watermarks.WatermarkConfig()
        self.qos_strategies = self.config.strategies()
        """Node QoS's resource-threshold strategies: the cluster one, then each node strategy."""
        self.nodes: dict[str, NodeEntry] = {}
        self._pod_node: dict[str, str] = {}
        self._bound: set[str] = set()
        """Pods placed by the extender's bind verb that no watch event has shown assigned yet."""
        self._unconfirmed: dict[str, float] = {}
        """Pods assumed by the extender that no watch event has shown assigned yet, with when they expire, oldest
        first (one TTL for all: expiries grow in insertion order)."""
        self.annotation_errors: dict[str, str] = {}
        self.dirty: set[str] = set()
        """Nodes changed since services.loadaware.fast last read them (it pops them)."""

    def _entry(self, node: str) -> NodeEntry:
        self.dirty.add(node)
        entry = self.nodes.get(node)
        if entry is None:
            entry = self.nodes[node] = NodeEntry()
        return entry

    def apply_config(self, args: LoadAwareArgs, config: watermarks.WatermarkConfig) -> None:
        """New args (the service's own with the watermarks applied) and node QoS thresholds: every node is redone."""
        loads_change = args.prod_usage_include_sys != self.args.prod_usage_include_sys or args.vector() != self.vector
        self.args, self.vector, self.config = args, args.vector(), config
        self.qos_strategies = config.strategies()
        for name, entry in self.nodes.items():
            entry.qos_strategy = watermarks.strategy_index(config.thresholds.nodes, entry.labels)
            if loads_change:
                entry.load = None
            self.dirty.add(name)

    @property
    def avoid_eviction_loops(self) -> bool:
        return self.config.watermarks.avoid_eviction_loops

    def apply_node(self, name: str, node: kube.Node | None) -> None:
        if node is None:
            entry = self.nodes.get(name)
            if entry is not None:
                self.dirty.add(name)
                entry.allocatable, entry.overrides, entry.labels, entry.qos_strategy = None, None, {}, 0
                self._drop_if_empty(name)
            self.annotation_errors.pop(name, None)
            return
        entry = self._entry(name)
        entry.allocatable = estimator.estimate_node(node)
        entry.labels = dict(node.metadata.labels)
        entry.qos_strategy = watermarks.strategy_index(self.config.thresholds.nodes, entry.labels)
        entry.overrides, error = parse_overrides(node.metadata.annotations.get(ANNOTATION_USAGE_THRESHOLDS))
        if error:
            self.annotation_errors[name] = error
        else:
            self.annotation_errors.pop(name, None)

    def apply_metric(self, event: NodeMetricComputed) -> None:
        entry = self.nodes.get(event.node)
        current = entry.metric if entry is not None else None
        if current is not None and current.update_time is not None and current.update_time > event.status.update_time:
            return  # an older report replayed after a newer one
        self.set_metric(event.node, metric_view(event))

    def set_metric(self, node: str, view: MetricView) -> None:
        """The node's NodeMetric as the extender reads it (apply_metric's, or one read from a NodeMetric object)."""
        entry = self._entry(node)
        entry.metric = view
        entry.load = None

    def apply_pod(self, uid: str, pod: kube.Pod | None, *, node: str, seen_at: float) -> None:
        """A pod seen by the watch: counted on `node` while it is assigned and neither Succeeded nor Failed."""
        key = uid or (kube.pod_key(pod) if pod is not None else "")
        if not key:
            return
        if pod is None or pod.status.phase in (kube.PHASE_SUCCEEDED, kube.PHASE_FAILED) or source.is_reserve_pod(pod):
            self.forget_pod(key)
            return
        if not node:
            # a pod's nodeName, once set, never goes back: the pod seen pending before a bind still in the pipeline
            if key not in self._bound:
                self.forget_pod(key)
            return
        self.assume(key, assigned_pod(pod, seen_at=seen_at, args=self.args), node=node)

    def assume(
        self, uid: str, pod: AssignedPod, *, node: str, bound: bool = False, assumed_at: float | None = None
    ) -> None:
        """Record `pod` on `node`: a watch event (`assumed_at` None), or a placement reported at `assumed_at`
        before the watch shows it, which expires `assumed_ttl_seconds` later unless a watch event confirms it.
        `bound`: the extender's bind verb is binding it, so a watch event showing it still unassigned is older and
        ignored."""
        if bound:
            self._bound.add(uid)
        else:
            self._bound.discard(uid)
        self._unconfirmed.pop(uid, None)
        if assumed_at is not None:
            self._unconfirmed[uid] = assumed_at + self.assumed_ttl_seconds
        previous = self._pod_node.get(uid)
        if previous is not None and previous != node:
            self.forget_pod(uid)
        entry = self._entry(node)
        old = entry.pods.get(uid)
        if (
            old is not None
            and not pod.dated_by_condition
            and old.timestamp < pod.timestamp
            and old.estimated == pod.estimated
        ):
            # the first sighting is the assign time (a PodScheduled transition, when the pod has one, dates it)
            deadline = pod.deadline if pod.deadline_after is None else old.timestamp + pod.deadline_after
            pod = dataclasses.replace(pod, timestamp=old.timestamp, deadline=deadline)
        entry.pods[uid] = pod
        entry.load = None
        self._pod_node[uid] = node

    def expire_assumed(self, now: float) -> list[str]:
        """Forget the assumed placements no watch event confirmed within the TTL; returns their keys."""
        expired = []
        for uid, expires in self._unconfirmed.items():
            if expires > now:
                break
            expired.append(uid)
        for uid in expired:
            self.forget_pod(uid)
        return expired

    def forget_pod(self, uid: str) -> None:
        self._bound.discard(uid)
        self._unconfirmed.pop(uid, None)
        node = self._pod_node.pop(uid, None)
        if node is None:
            return
        entry = self.nodes.get(node)
        if entry is not None and entry.pods.pop(uid, None) is not None:
            self.dirty.add(node)
            entry.load = None
            self._drop_if_empty(node)

    def forget_assumed(self, uid: str, pod: AssignedPod) -> bool:
        """Undo `assume(uid, pod, …)`: forget the pod only while `pod` is still its entry (a watch event since then
        replaced it and knows better). True when it was forgotten."""
        node = self._pod_node.get(uid)
        entry = self.nodes.get(node) if node is not None else None
        if entry is None or entry.pods.get(uid) is not pod:
            return False
        self.forget_pod(uid)
        return True

    def knows_node(self, node: str) -> bool:
        """A Node or a NodeMetric of this name was seen (pods alone do not make a node known)."""
        entry = self.nodes.get(node)
        return entry is not None and (entry.allocatable is not None or entry.metric is not None)

    def pod_node(self, uid: str) -> str | None:
        return self._pod_node.get(uid)

    def load_of(self, node: str) -> NodeLoad | None:
        entry = self.nodes.get(node)
        if entry is None or entry.metric is None:
            return None
        if entry.load is None:
            entry.load = node_load(
                entry.metric, entry.pods.values(), include_sys=self.args.prod_usage_include_sys, vector=self.vector
            )
        return entry.load

    def _drop_if_empty(self, node: str) -> None:
        entry = self.nodes.get(node)
        if entry is not None and entry.allocatable is None and entry.metric is None and not entry.pods:
            del self.nodes[node]
