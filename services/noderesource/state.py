"""The cluster state the noderesource service decides from, kept in memory from events, and the per-node decision.

Pure (no I/O, clock or event loop; `now` is a parameter): services.noderesource.service feeds `ClusterState.apply`
with NodeObserved / PodObserved / ConfigMapObserved / NodeTopologyObserved (KOORD_CLUSTER) and NodeMetricComputed
(KOORD_NODEMETRIC) events, recomputes the nodes it returns with `decide`, and publishes the resulting
NodeResourceComputed events. Which nodes an event affects follows the §2.3 triggers: a Node → itself; a Pod → its
old and its new node; a NodeMetric → its node; a NodeResourceTopology → its node (its NUMA zones, §2.7, computed
when batch is); a change of the effective colocation config → every node. Events older than what is held (by
resourceVersion when both parse as integers, by report time for NodeMetrics) are ignored, so a relist or a
redelivery cannot roll state back (a deleted pod's tombstone version only while it is among the last POD_TOMBSTONES_KEPT
pods deleted: every finished pod leaves one). Pods of nodes not seen yet are kept (the node may come later) but nothing
is decided for a node that is not known. What was ignored and why is appended to `ClusterState.problems`, which the
service drains into its skipped-input counter. A scaled-out replica holds only its share of the nodes: it takes in
only the events that `concerns` it and, when its share shrinks, `retain`s the rest.

Hysteresis (§2.3 step 7) compares a new decision with the last one whose write was due (`LastWrite`), not with the
Node's status: the k8s writer applies decisions asynchronously, and the decision log is the record of what was
asked. Every recomputation that changes something is published, with `write_due` saying whether the node should
be written; a recomputation that changes neither resources, annotations, outcome nor NodeMetric spec, and is not
due, is a repeat (`is_repeat`) and not published.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Final

import msgspec

from schemas import kube, resources, topology
from schemas.cluster import ConfigMapObserved, NodeObserved, NodeTopologyObserved, PodObserved
from schemas.koordinator import ANNOTATION_CPU_NORMALIZATION_RATIO
from schemas.node import NodeMetricComputed
from schemas.nodemetric_json import NodeUsageSnapshot, snapshot_from_computed
from schemas.noderesource import NodeResourceComputed, Outcome, Trigger
from services.noderesource import config as colocation
from services.noderesource import core, cpu_normalization, numa
from services.noderesource.smoothing import SmoothingPolicy, smooth

StateEvent = NodeObserved | PodObserved | ConfigMapObserved | NodeTopologyObserved | NodeMetricComputed

PROBLEM_STALE_VERSION: Final = "stale_resource_version"
PROBLEM_MISSING_OBJECT: Final = "missing_object"
PROBLEM_STALE_NODEMETRIC: Final = "stale_nodemetric"
PROBLEM_CONFIG_ERROR: Final = "config_error"
PROBLEM_OTHER_CONFIGMAP: Final = "unwatched_configmap"
POD_TOMBSTONES_KEPT: Final = 20_000
"""How many deleted pods' versions are held (the most recent deletions): a redelivered or relisted older event of
one of them is ignored instead of bringing the pod back. Far more than a cluster deletes while an event can still be
redelivered (minutes: a busy 1,000-node cluster deletes ~10,000 pods an hour), few enough to hold (~300 B each)."""


class LastWrite(msgspec.Struct, frozen=True, kw_only=True):
    """The last decision of a node whose write was due: when, and the resources it wrote (absent ones left out)."""

    at: float
    resources: dict[str, int]


def trigger_of(event: StateEvent) -> Trigger:
    match event:
        case NodeObserved():
            return "node"
        case PodObserved():
            return "pods"
        case ConfigMapObserved():
            return "config"
        case NodeMetricComputed():
            return "nodemetric"
        case NodeTopologyObserved():
            return "topology"


def event_time(event: StateEvent) -> float:
    """The event's own time: when the bridge observed the object, or the NodeMetric's report time."""
    if isinstance(event, NodeMetricComputed):
        return event.report_time
    return event.observed_at


def _newer_version(held: tuple[str, bool] | None, version: str, deleted: bool) -> bool | None:
    """True if (version, deleted) is news against `held`, False if it is the same, None if it is older."""
    if held is None:
        return True
    held_version, held_deleted = held
    if version == held_version and deleted == held_deleted:
        return False
    try:
        old, new = int(held_version), int(version)
    except ValueError:
        return True  # not comparable (empty or opaque): the later message wins, as on a last-value subject
    if new < old:
        return None
    return new > old or deleted != held_deleted


class ClusterState:
    """Nodes, pods (with a node → pods index), the latest NodeMetric per node and the colocation config."""

    def __init__(self, *, smoothing: SmoothingPolicy | None = None) -> None:
        self.smoothing = smoothing or SmoothingPolicy()
        """Opt-in smoothing of decreases (off by default: Koordinator's numbers)."""
        self.nodes: dict[str, kube.Node] = {}
        self.pods: dict[str, kube.PodSummary] = {}
        """Pod key → what the calculation reads of it (a summary per pod version, not the whole object)."""
        self.pod_node: dict[str, str] = {}
        """Pod key → the node it is bound to (unscheduled pods are absent)."""
        self.pods_by_node: dict[str, set[str]] = {}
        self.snapshots: dict[str, NodeUsageSnapshot] = {}
        self.zones: dict[str, tuple[topology.NumaZone, ...]] = {}
        """Node → the NUMA zones of its NodeResourceTopology (absent: none, or none listing cpu or memory)."""
        self.config = colocation.ColocationConfigState()
        self.cpu_normalization: cpu_normalization.CpuNormalizationConfig | None = None
        """The ConfigMap's cpu-normalization-config (None before the ConfigMap or its absence is known)."""
        self.cpu_normalization_error: str | None = None
        """Why the key's current content is not in effect (the previous one is kept); None when it is."""
        self.cpu_basic_info: dict[str, str] = {}
        """Node → its NodeResourceTopology's cpu-basic-info annotation (absent: none seen)."""
        self.config_seen = False
        """Whether any version of the ConfigMap (or its tombstone) was applied."""
        self.problems: list[str] = []
        """Why events were ignored, in order; the service drains it."""
        self._versions: dict[tuple[str, str], tuple[str, bool]] = {}
        """(kind, key) → (resourceVersion, deleted) of the newest event applied, tombstones included (a pod's
        only while it is among the last POD_TOMBSTONES_KEPT deleted: `_pod_tombstones`)."""
        self._pod_tombstones: dict[str, None] = {}
        """The deleted pods whose tombstone `_versions` holds, oldest deletion first."""

    # --- applying events

    def apply(self, event: StateEvent) -> set[str]:
        """Take the event into the state; the names of the nodes whose decision may have changed."""
        match event:
            case NodeObserved():
                return self._apply_node(event)
            case PodObserved():
                return self._apply_pod(event)
            case ConfigMapObserved():
                return self._apply_configmap(event)
            case NodeMetricComputed():
                return self._apply_nodemetric(event)
            case NodeTopologyObserved():
                return self._apply_topology(event)

    def _accept(self, kind: str, key: str, version: str, deleted: bool) -> bool:
        verdict = _newer_version(self._versions.get((kind, key)), version, deleted)
        if verdict is None:
            self.problems.append(PROBLEM_STALE_VERSION)
            return False
        if verdict:
            self._versions[(kind, key)] = (version, deleted)
        return verdict

    def _apply_node(self, event: NodeObserved) -> set[str]:
        if not event.deleted and event.node is None:
            self.problems.append(PROBLEM_MISSING_OBJECT)
            return set()
        if not self._accept("node", event.name, event.resource_version, event.deleted):
            return set()
        if event.deleted or event.node is None:
            self.nodes.pop(event.name, None)
        else:
            self.nodes[event.name] = event.node
        return {event.name}

    def _apply_pod(self, event: PodObserved) -> set[str]:
        key = f"{event.namespace}/{event.name}"
        if not event.deleted and event.pod is None:
            self.problems.append(PROBLEM_MISSING_OBJECT)
            return set()
        if not self._accept("pod", key, event.resource_version, event.deleted):
            return set()
        old_node = self.pod_node.pop(key, "")
        if old_node:
            members = self.pods_by_node.get(old_node)
            if members is not None:
                members.discard(key)
                if not members:
                    del self.pods_by_node[old_node]
        new_node = ""
        if event.deleted or event.pod is None:
            self.pods.pop(key, None)
            self._hold_tombstone(key)
        else:
            self._pod_tombstones.pop(key, None)  # the name is in use again (a StatefulSet's pod)
            new_node = sys.intern(event.node_name or event.pod.spec.node_name)  # one string per node, not per pod
            self.pods[key] = msgspec.structs.replace(kube.summarize_pod(event.pod), key=key, node_name=new_node)
            if new_node:
                self.pod_node[key] = new_node
                self.pods_by_node.setdefault(new_node, set()).add(key)
        return {name for name in (old_node, new_node) if name}

    def _hold_tombstone(self, key: str) -> None:
        """Hold pod `key`'s tombstone version as the newest; forget the oldest beyond POD_TOMBSTONES_KEPT."""
        self._pod_tombstones.pop(key, None)
        self._pod_tombstones[key] = None
        while len(self._pod_tombstones) > POD_TOMBSTONES_KEPT:
            oldest = next(iter(self._pod_tombstones))
            del self._pod_tombstones[oldest]
            held = self._versions.get(("pod", oldest))
            if held is not None and held[1]:
                del self._versions[("pod", oldest)]

    def _apply_configmap(self, event: ConfigMapObserved) -> set[str]:
        if (event.namespace, event.name) != (colocation.CONFIGMAP_NAMESPACE, colocation.CONFIGMAP_NAME):
            self.problems.append(PROBLEM_OTHER_CONFIGMAP)
            return set()
        if not self._accept("configmap", f"{event.namespace}/{event.name}", event.resource_version, event.deleted):
            return set()
        self.config_seen = True
        change = self.config.apply(None if event.deleted else event.data)
        self.config = change.state
        if change.error is not None:
            self.problems.append(PROBLEM_CONFIG_ERROR)
        normalization_changed = self._apply_cpu_normalization(None if event.deleted else event.data)
        return set(self.nodes) if change.changed or normalization_changed else set()

    def _apply_cpu_normalization(self, data: Mapping[str, str] | None) -> bool:
        """Take the ConfigMap's cpu-normalization-config in (a bad one keeps the previous); whether it changed."""
        text = None if data is None else data.get(cpu_normalization.CONFIG_KEY)
        try:
            parsed = cpu_normalization.parse_config(text)
        except cpu_normalization.CpuNormalizationConfigError as err:
            self.cpu_normalization_error = (
                f"invalid {cpu_normalization.CONFIG_KEY}, keeping the previous configuration: {err}"
            )
            self.problems.append(PROBLEM_CONFIG_ERROR)
            return False
        self.cpu_normalization_error = None
        changed = parsed != self.cpu_normalization
        self.cpu_normalization = parsed
        return changed

    def _apply_topology(self, event: NodeTopologyObserved) -> set[str]:
        if not self._accept("nrt", event.name, event.resource_version, event.deleted):
            return set()
        zones = () if event.deleted else topology.numa_zones(topology.NodeResourceTopology(zones=event.zones))
        basic_info = "" if event.deleted else event.cpu_basic_info
        basic_info_changed = basic_info != self.cpu_basic_info.get(event.name, "")
        if basic_info:
            self.cpu_basic_info[event.name] = basic_info
        else:
            self.cpu_basic_info.pop(event.name, None)
        if zones == self.zones.get(event.name, ()):
            return {event.name} if basic_info_changed else set()
        if zones:
            self.zones[event.name] = zones
        else:
            self.zones.pop(event.name, None)
        return {event.name}

    def _apply_nodemetric(self, event: NodeMetricComputed) -> set[str]:
        held = self.snapshots.get(event.node)
        if held is not None and held.update_time is not None and event.report_time <= held.update_time:
            if event.report_time < held.update_time:
                self.problems.append(PROBLEM_STALE_NODEMETRIC)
            return set()
        self.snapshots[event.node] = snapshot_from_computed(event)
        return {event.node}

    # --- a replica's share of the nodes (services.common.membership)

    def concerns(self, event: StateEvent, owns: Callable[[str], bool]) -> bool:
        """Whether a replica that decides only the nodes `owns` accepts must take `event` in: the events of its
        nodes, the ConfigMap, and every event of a pod it holds (its update or deletion). Pods not bound yet are
        left out: they weigh on no node until a later event binds them."""
        match event:
            case NodeObserved() | NodeTopologyObserved():
                return owns(event.name)
            case NodeMetricComputed():
                return owns(event.node)
            case ConfigMapObserved():
                return True
            case PodObserved():
                if f"{event.namespace}/{event.name}" in self.pods:
                    return True
                node = event.node_name or (event.pod.spec.node_name if event.pod is not None else "")
                return bool(node) and owns(node)

    def retain(self, owns: Callable[[str], bool]) -> None:
        """Forget every node `owns` rejects — the Node, its pods, NodeMetric and NUMA zones, and the versions held
        for them, so that a later replay takes them in again — and every pod not bound to a kept node."""
        for name in [n for n in self.nodes if not owns(n)]:
            del self.nodes[name]
        for key in [k for k in self.pods if not (node := self.pod_node.get(k, "")) or not owns(node)]:
            del self.pods[key]
            self.pod_node.pop(key, None)
            self._versions.pop(("pod", key), None)
        self.pods_by_node = {node: keys for node, keys in self.pods_by_node.items() if owns(node)}
        self.snapshots = {node: snapshot for node, snapshot in self.snapshots.items() if owns(node)}
        self.zones = {node: zones for node, zones in self.zones.items() if owns(node)}
        self.cpu_basic_info = {node: info for node, info in self.cpu_basic_info.items() if owns(node)}
        self._versions = {
            (kind, key): held
            for (kind, key), held in self._versions.items()
            if kind not in ("node", "nrt") or owns(key)
        }

    @property
    def configmap_version(self) -> str:
        """The resourceVersion of the slo-controller-config ConfigMap event applied last ("" before any)."""
        key = ("configmap", f"{colocation.CONFIGMAP_NAMESPACE}/{colocation.CONFIGMAP_NAME}")
        return self._versions.get(key, ("", False))[0]

    def assume_configmap_absent(self) -> set[str]:
        """No ConfigMap was seen by the end of the start-up replay: Koordinator treats NotFound as the defaults
        (colocation disabled). Returns the nodes to recompute; nothing once a ConfigMap was seen."""
        if self.config_seen or self.config.available:
            return set()
        change = self.config.apply(None)
        self.config = change.state
        normalization_changed = self._apply_cpu_normalization(None)
        return set(self.nodes) if change.changed or normalization_changed else set()

    # --- deciding

    def decide(
        self,
        node: str,
        *,
        now: float,
        last_written: LastWrite | None,
        trigger: Iterable[Trigger] = ("resync",),
    ) -> NodeResourceComputed | None:
        """The node's batch/mid decision at `now`; None when the node is unknown or the config is not loaded yet
        (§2.3 step 1: no reconcile before the config cache is available)."""
        node_object = self.nodes.get(node)
        if node_object is None or not self.config.available:
            return None
        meta = node_object.metadata
        placement = colocation.node_strategy(self.config.config, meta.labels, meta.annotations)
        strategy = msgspec.structs.replace(placement.strategy, enable=placement.colocation_enabled)
        pods = [self.pods[key] for key in sorted(self.pods_by_node.get(node, ()))]
        result = core.calculate(node_object, pods, self.snapshots.get(node), strategy, now)
        ratio = cpu_normalization.node_ratio(self.cpu_normalization, meta.labels, self.cpu_basic_info.get(node))
        patch = core.prepare(node_object, result, cpu_normalization_ratio=ratio.ratio)
        annotations = dict(patch.annotations)
        if ratio.ratio is not None:
            annotations[ANNOTATION_CPU_NORMALIZATION_RATIO] = ratio.ratio
        outcome, reason = _outcome(result)
        snapshot, zones = self.snapshots.get(node), self.zones.get(node)
        by_zone = None
        if zones and snapshot is not None and outcome == "computed":  # §2.7 runs only when batch did
            by_zone = numa.calculate(node_object, pods, snapshot, strategy, zones)
        final: dict[str, int | None] = dict(patch.resources)
        smoothing_notes: dict[str, str] = {}
        if self.smoothing.enabled and outcome == "computed":
            final, smoothing_notes = smooth(
                patch.resources,
                capacity=kube.node_capacity(node_object),
                requested=resources.total(p.request for p in pods if p.active),
                last_written=last_written.resources if last_written else {},
                last_written_at=last_written.at if last_written else None,
                now=now,
                policy=self.smoothing,
            )
        written = {name: value for name, value in final.items() if value is not None}
        sync = core.needs_sync(
            last_written.resources if last_written else {},
            written,
            strategy=strategy,
            last_synced_at=last_written.at if last_written else None,
            now=now,
        )
        warnings = placement.warnings + tuple(
            error for error in (self.config.error, self.cpu_normalization_error) if error
        )
        return NodeResourceComputed(
            node=node,
            computed_at=now,
            trigger=tuple(sorted(set(trigger))),
            outcome=outcome,
            reason=reason,
            resources=final,
            annotations=annotations,
            explanation=dict(result.resources),
            prepare_steps={name: steps for name, steps in patch.steps.items() if steps},
            pods=result.pods,
            write_due=sync.needed,
            write_reason=sync.reason,
            last_write_at=last_written.at if last_written else None,
            last_write_resources=dict(last_written.resources) if last_written else {},
            node_config=placement.node_config_name or "",
            warnings=warnings,
            smoothing=smoothing_notes,
            nodemetric_spec=None if self.config.error else colocation.metric_collect_policy(strategy),
            zones=by_zone.values() if by_zone else {},
            zone_explanation={z.zone: dict(z.resources) for z in by_zone.zones} if by_zone else {},
            meta_due=cpu_normalization.annotation_differs(meta.annotations, ratio.ratio),
            cpu_normalization=ratio.reason,
        )


def _outcome(result: core.NodeResourceResult) -> tuple[Outcome, str]:
    reasons = {item.reason for item in result.resources.values()}
    if core.REASON_DISABLED in reasons:
        return "disabled", core.REASON_DISABLED
    if core.REASON_BATCH_DEGRADED in reasons:
        return "degraded", core.REASON_BATCH_DEGRADED
    return "computed", ""


def last_write_after(decision: NodeResourceComputed) -> LastWrite | None:
    """The hysteresis baseline once `decision` is published: itself when its write is due, else the baseline it
    was compared with. Also how a restarted service recovers the baseline from the last published decision."""
    if decision.write_due:
        return LastWrite(at=decision.computed_at, resources=decision.written_amounts)
    if decision.last_write_at is None:
        return None
    return LastWrite(at=decision.last_write_at, resources=dict(decision.last_write_resources))


def is_repeat(previous: NodeResourceComputed | None, decision: NodeResourceComputed) -> bool:
    """A decision not worth publishing: no write due, and the same resources, annotations, outcome and NodeMetric
    spec as the previous published one (the explanation's numbers may have moved within the hysteresis)."""
    return (
        previous is not None
        and not decision.write_due
        and decision.resources == previous.resources
        and decision.annotations == previous.annotations
        and (decision.outcome, decision.reason) == (previous.outcome, previous.reason)
        and decision.nodemetric_spec == previous.nodemetric_spec
        and decision.zones == previous.zones
    )


def decision_identity(decision: NodeResourceComputed) -> bytes:
    """What a decision decides, encoded: the node, its time, and is_repeat's fields with whether a write is due. Its
    msg id is made from this, not from the whole message, so two replicas that briefly both own the node (a
    partition moving) and decide it at the same time to the same effect publish one message, which JetStream
    deduplicates, whatever moved each to it (its trigger: a replica replaying what it gained names more causes) and
    however each explains it."""
    return msgspec.json.encode(
        (
            decision.node,
            decision.computed_at,
            decision.outcome,
            decision.reason,
            decision.resources,
            decision.annotations,
            decision.write_due,
            decision.meta_due,
            decision.nodemetric_spec,
            decision.zones,
        )
    )


def decision_time(trigger_time: float, previous: NodeResourceComputed | None) -> float:
    """A node's decision times never go back: the triggering event's time, or the previous decision's if later
    (a replayed old event must not un-degrade a node a later resync degraded)."""
    return trigger_time if previous is None else max(trigger_time, previous.computed_at)
