"""Load-aware descheduling (issue 5 point 4; Koordinator's LowNodeLoad idea over our NodeMetric stream). Pure.

Every round `plan(nodes, streaks, args, now=)` looks at each node's latest NodeMetric usage against its allocatable: a
node above `highThresholds` (percent, any resource) in `anomalyRounds` consecutive rounds is overloaded; a node below
`lowThresholds` on every resource is a destination. When there are destinations, an overloaded node gives up its pods in
PodSorter order (evict-cheapest first: services.migration.order), skipping pods the non-retryable filters forbid, until
its usage would be back under the high threshold — and never more in total than the destinations can take before they
themselves reach the high threshold. A node whose NodeMetric is stale (no update within `staleAfterSeconds`,
NodeMetric's own rule) or missing takes no part: neither source nor destination, and its streak restarts (stale from the
expiry on, as the scheduler's §6.5 rule). `apply_watermarks` takes the thresholds and the staleness bound from the
slo-controller-config's load-watermarks-config when it sets them, the same values the load-aware scheduler filters with.
The answer lists (node, pod, why) requests; the shell turns them into MigrationRequested with a name derived from the
pod's uid, so a pod is asked for once however many rounds see it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec

from schemas import kube
from schemas.qos import WatermarksInEffect
from services.common.watermarks import WatermarkConfig, Watermarks, fields_set
from services.migration import filters, order
from services.migration.args import MigrationArgs

RESOURCES = ("cpu", "memory")


class LowNodeLoadArgs(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    enabled: bool = False
    high_thresholds: dict[str, float] = msgspec.field(default_factory=lambda: {"cpu": 70.0, "memory": 80.0})
    """Percent of allocatable above which a node is overloaded (any resource)."""
    low_thresholds: dict[str, float] = msgspec.field(default_factory=lambda: {"cpu": 30.0, "memory": 40.0})
    """Percent of allocatable below which (every resource) a node can take pods."""
    anomaly_rounds: int = 3
    """Consecutive overloaded rounds before a node's pods are moved (the anomaly debounce)."""
    interval_seconds: float = 60.0
    stale_after_seconds: float = 180.0
    max_pods_per_node: int = 5
    """At most this many requests per overloaded node per round."""


def apply_watermarks(args: LowNodeLoadArgs, marks: Watermarks) -> LowNodeLoadArgs:
    """The args with what the slo-controller-config's load-watermarks-config sets (services.common.watermarks): the
    scheduler's usage thresholds are the overloaded line (a resource the scheduler does not check, 0, is never
    overloaded), its lowThresholds the destination line, its NodeMetric expiry the staleness bound."""
    changes: dict[str, object] = {}
    if marks.usage_thresholds is not None:
        changes["high_thresholds"] = {r: float(v) for r, v in marks.usage_thresholds.items() if v > 0}
    if marks.low_thresholds is not None:
        changes["low_thresholds"] = {r: float(v) for r, v in marks.low_thresholds.items()}
    if marks.node_metric_expiration_seconds is not None:
        changes["stale_after_seconds"] = float(marks.node_metric_expiration_seconds)
    return msgspec.structs.replace(args, **changes) if changes else args


def stated_watermarks(args: LowNodeLoadArgs, config: WatermarkConfig, *, at: float) -> WatermarksInEffect:
    """What the descheduler decides with (args with the watermarks applied), as it states it on the KOORD_SLO
    bucket."""
    return WatermarksInEffect(
        service="descheduler",
        at=at,
        enabled=args.enabled,
        usage_thresholds=dict(args.high_thresholds),
        low_thresholds=dict(args.low_thresholds),
        stale_after_seconds=args.stale_after_seconds,
        from_configmap=fields_set(config.watermarks),
        configmap_errors=dict(config.errors),
    )


@dataclass(frozen=True, slots=True)
class NodeLoad:
    allocatable: Mapping[str, int]
    usage: Mapping[str, int]
    """The NodeMetric's nodeUsage (cpu millicores, memory bytes)."""
    updated: float
    """The NodeMetric's updateTime."""
    pods: Sequence[tuple[kube.Pod, Mapping[str, int]]] = ()
    """The node's pods with their NodeMetric podUsage (pods without one count as using nothing)."""


@dataclass(frozen=True, slots=True)
class Request:
    node: str
    pod: kube.Pod
    reason: str


def _percent(load: NodeLoad, resource: str) -> float:
    capacity = load.allocatable.get(resource, 0)
    return 100.0 * load.usage.get(resource, 0) / capacity if capacity > 0 else 0.0


def plan(
    nodes: Mapping[str, NodeLoad],
    streaks: Mapping[str, int],
    args: LowNodeLoadArgs,
    migration_args: MigrationArgs,
    *,
    now: float,
) -> tuple[dict[str, int], list[Request]]:
    """(the new overload streak per node, the requests of this round)."""
    fresh = {n: load for n, load in nodes.items() if now - load.updated < args.stale_after_seconds}
    new_streaks: dict[str, int] = {}
    overloaded: list[str] = []
    for name, load in sorted(fresh.items()):
        over = [r for r in RESOURCES if _percent(load, r) > args.high_thresholds.get(r, 100.0)]
        if over:
            new_streaks[name] = streaks.get(name, 0) + 1
            if new_streaks[name] >= args.anomaly_rounds:
                overloaded.append(name)
    destinations = [
        load
        for name, load in fresh.items()
        if name not in new_streaks and all(_percent(load, r) < args.low_thresholds.get(r, 0.0) for r in RESOURCES)
    ]
    room = {
        r: sum(
            max(0, int(load.allocatable.get(r, 0) * args.high_thresholds.get(r, 100.0) / 100) - load.usage.get(r, 0))
            for load in destinations
        )
        for r in RESOURCES
    }
    requests: list[Request] = []
    if not destinations:
        return new_streaks, requests
    for name in overloaded:
        load = fresh[name]
        usage = dict(load.usage)
        target = {r: int(load.allocatable.get(r, 0) * args.high_thresholds.get(r, 100.0) / 100) for r in RESOURCES}
        for pod, pod_usage in sorted(load.pods, key=lambda item: order.pod_sort_key(item[0])):
            taken = sum(1 for q in requests if q.node == name)
            if taken >= args.max_pods_per_node or all(usage.get(r, 0) <= target[r] for r in RESOURCES):
                break
            if filters.evictable(pod, migration_args) is not None:
                continue  # never evictable (the arbiter would fail it); the workload rules are the arbiter's
            if any(pod_usage.get(r, 0) > room[r] for r in RESOURCES if usage.get(r, 0) > target[r]):
                continue  # the destinations cannot take it
            for r in RESOURCES:
                usage[r] = usage.get(r, 0) - pod_usage.get(r, 0)
                room[r] -= pod_usage.get(r, 0)
            why = ", ".join(
                f"{r} {_percent(load, r):.0f}% > {args.high_thresholds.get(r, 100.0):g}%"
                for r in RESOURCES
                if _percent(load, r) > args.high_thresholds.get(r, 100.0)
            )
            requests.append(Request(name, pod, f"node {name} overloaded for {new_streaks[name]} rounds ({why})"))
    return new_streaks, requests
