"""The batch and mid overcommit calculation (spec §2.3–2.6, §2.8): pure, synchronous, `now` is a parameter.

Called by `koordbus calc batch-resource` and by the noderesource service. `calculate` turns a Node, its pods, its
NodeMetric and the node's effective ColocationStrategy into the four extended resources (batch-cpu, batch-memory,
mid-cpu, mid-memory), each with its formula and numbers, or removed with a reason (colocation disabled, NodeMetric
missing or stale). `prepare` turns that result into what Koordinator writes on the Node (cpu-normalization
scaling, rounding, the originExtendedAllocatable annotation, third-party batch allocations subtracted) as a
`NodeResourcePatch` value; `needs_sync` decides whether the write is due. The explanation structs
(ResourceExplanation, PodAccounting) live in schemas.noderesource, as part of the NodeResourceComputed event.
Amounts are integers: batch-cpu and mid-cpu count millicores, memory is bytes. Ratios are applied in float64 and
truncated, as Koordinator does, so results match it to the unit.

Koordinator quirks kept on purpose: a high-priority pod without a metric adds its request to the usage sum but not
to the max(usage, request) sum (the NUMA variant adds it to both); the CPU `request` policy falls back to `usage`;
the kubelet and annotation reservations combine by max, not sum.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Final

import msgspec

from schemas import koordinator, kube, resources, vocab
from schemas.nodemetric_json import NodeUsageSnapshot, PodUsage
from schemas.noderesource import PodAccounting as PodAccounting
from schemas.noderesource import ResourceExplanation as ResourceExplanation
from services.noderesource import strategy as strategies

BATCH_RESOURCES: Final = (vocab.BATCH_CPU, vocab.BATCH_MEMORY)
MID_RESOURCES: Final = (vocab.MID_CPU, vocab.MID_MEMORY)
ALL_RESOURCES: Final = BATCH_RESOURCES + MID_RESOURCES

REASON_DISABLED: Final = "node colocation is disabled in Config, reason: DisableInConfig"
REASON_BATCH_DEGRADED: Final = "degrade node resource because of abnormal nodeMetric, reason: degradedByBatchResource"
REASON_MID_DEGRADED: Final = "degrade node Mid resource because of abnormal nodeMetric, reason: degradedByMidResource"
REASON_NO_ALLOCATABLE: Final = "node has no status.allocatable, the mid calculation does not run"

_CPU, _MEMORY = resources.CPU, resources.MEMORY
_CPU_AND_MEMORY: Final = (_CPU, _MEMORY)
_LOW_PRIORITY: Final = frozenset({vocab.PRIORITY_BATCH, vocab.PRIORITY_FREE})
_MID_OR_LOWER: Final = frozenset({vocab.PRIORITY_MID, vocab.PRIORITY_BATCH, vocab.PRIORITY_FREE})


class NodeResourceResult(msgspec.Struct, frozen=True, kw_only=True):
    """The four resources, keyed by name, and how the pods were counted (empty when batch did not run)."""

    resources: dict[str, ResourceExplanation]
    pods: PodAccounting = PodAccounting()

    def values(self) -> dict[str, int | None]:
        return {name: item.value for name, item in self.resources.items()}


class NodeResourcePatch(msgspec.Struct, frozen=True, kw_only=True):
    """What to write on the Node: each resource's amount for both status.capacity and status.allocatable (None:
    delete the key), annotations to set, and per resource the steps that led from the calculated value there."""

    resources: dict[str, int | None]
    annotations: dict[str, str]
    steps: dict[str, list[str]] = {}


class SyncDecision(msgspec.Struct, frozen=True, kw_only=True):
    needed: bool
    reason: str


# --- small exact helpers


def scale(amount: int, ratio: float) -> int:
    """Go's `int64(float64(amount) * ratio)`: float64 product, truncated toward zero."""
    try:
        return int(float(amount) * ratio)
    except OverflowError:  # beyond float range: only absurd input gets here; keep it finite and exact
        return int(Fraction(amount) * Fraction(ratio))


def _percent_ratio(percent: int) -> float:
    return percent / 100


def _get(rl: Mapping[str, int], name: str) -> int:
    return rl.get(name, 0)


def _cpu_and_memory(rl: Mapping[str, int]) -> resources.ResourceList:
    return {name: rl.get(name, 0) for name in _CPU_AND_MEMORY}


# --- node reservation


def kubelet_reserved(node: kube.Node) -> resources.ResourceList:
    """`max(capacity − allocatable, 0)` on cpu and memory."""
    capacity = resources.mask(kube.node_capacity(node), _CPU_AND_MEMORY)
    allocatable = resources.mask(kube.node_allocatable(node), _CPU_AND_MEMORY)
    return _cpu_and_memory(resources.sub_nonneg(capacity, allocatable))


def node_reserved(node: kube.Node) -> resources.ResourceList:
    """`max(kubelet reserved, annotation reserved)` per resource, on cpu and memory."""
    annotated = koordinator.node_reservation_resources(node.metadata.annotations) or {}
    return _cpu_and_memory(resources.max_rl(kubelet_reserved(node), annotated))


def host_apps_used_above(snapshot: NodeUsageSnapshot, priority_class: str) -> resources.ResourceList:
    """Usage of the host applications whose class's default priority is above `priority_class`'s."""
    floor = _default_priority(priority_class)
    apps = [app.usage for app in snapshot.host_applications if _default_priority(app.priority) > floor]
    return _cpu_and_memory(resources.total(apps))


def _default_priority(priority_class: str) -> int:
    bounds = vocab.PRIORITY_RANGES.get(priority_class)
    return bounds[2] if bounds else 0


def is_degraded(snapshot: NodeUsageSnapshot | None, strategy: strategies.ColocationStrategy, now: float) -> bool:
    """No NodeMetric, no status.updateTime, or `now` later than updateTime + degradeTimeMinutes."""
    if snapshot is None or snapshot.update_time is None:
        return True
    return now > snapshot.update_time + strategy.degrade_time_minutes * 60


# --- formulas rendered with their numbers


def _difference(name: str, terms: Sequence[tuple[str, int]]) -> tuple[int, str, str]:
    """`max(first − rest…, 0)`: the value, the formula and the formula with numbers."""
    raw = terms[0][1] - sum(value for _, value in terms[1:])
    value = max(raw, 0)
    formula = " − ".join(term for term, _ in terms)
    filled = " − ".join(f"{term} {amount}" for term, amount in terms)
    if raw < 0:
        filled = f"max({filled} = {raw}, 0)"
    return value, formula, f"{name} {value} = {filled}"


def _capped(
    name: str, value: int, formula: str, message: str, capacity: int, percent: int | None, *, knob: str
) -> tuple[int, str, str, dict[str, int]]:
    """Apply an optional `capacity × percent/100` cap (Koordinator's batch/mid threshold percents)."""
    if percent is None:
        return value, formula, message, {}
    cap = scale(capacity, _percent_ratio(percent))
    capped = min(value, cap)
    body = message.split(" = ", 1)[1]
    return (
        capped,
        f"min({formula}, capacity × {knob}/100)",
        f"{name} {capped} = min({body} = {value}, capacity {capacity} × {percent}% = {cap})",
        {"uncapped": value, "cap": cap},
    )


# --- batch (§2.4)


class _NodeFigures(msgspec.Struct, frozen=True, kw_only=True):
    """The node's cpu/memory capacity and reservation, parsed once per calculation."""

    capacity: resources.ResourceList
    reserved: resources.ResourceList


class CountedPods(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A node's pods and pod metrics as the batch calculation counts them, node level and per NUMA zone alike."""

    high_priority: list[tuple[kube.PodSummary, PodUsage | None]]
    """The active pods not of the batch or free priority class, each with its metric (None: it has none)."""
    dangling: list[PodUsage]
    """The metrics of no listed pod, not of the batch or free priority class: their usage counts too."""
    accounting: PodAccounting


def count_pods(pods: Sequence[kube.PodSummary], snapshot: NodeUsageSnapshot) -> CountedPods:
    """Which pods and metrics the batch sums take (here and in services.noderesource.numa), and how many of each
    kind there were: inactive pods are skipped (their metrics are not dangling), low-priority ones and dangling
    low-priority metrics too; a high-priority pod counts as without a metric, or else as LSE when it is one."""
    metrics = {metric.key: metric for metric in snapshot.pods}
    dangling = dict(metrics)
    high_priority: list[tuple[kube.PodSummary, PodUsage | None]] = []
    counts = dict.fromkeys(PodAccounting.__struct_fields__, 0)
    for pod in pods:
        if not pod.active:
            counts["not_running_or_pending_skipped"] += 1
            continue
        metric = metrics.get(pod.key)
        if metric is not None:
            dangling.pop(pod.key, None)
        if pod.priority_class in _LOW_PRIORITY:
            counts["low_priority_skipped"] += 1
            continue
        counts["high_priority"] += 1
        if metric is None:
            counts["high_priority_without_metric"] += 1
        elif pod.qos_class == vocab.QOS_LSE:
            counts["high_priority_lse"] += 1
        high_priority.append((pod, metric))
    counted_dangling: list[PodUsage] = []
    for metric in dangling.values():
        if metric.priority in _LOW_PRIORITY:
            counts["dangling_metrics_skipped"] += 1
            continue
        counts["dangling_metrics_counted"] += 1
        counted_dangling.append(metric)
    return CountedPods(high_priority=high_priority, dangling=counted_dangling, accounting=PodAccounting(**counts))


class _BatchSums(msgspec.Struct, kw_only=True):
    request: resources.ResourceList
    used: resources.ResourceList
    max_used_request: resources.ResourceList
    accounting: PodAccounting


def _sum_high_priority_pods(pods: Sequence[kube.PodSummary], snapshot: NodeUsageSnapshot) -> _BatchSums:
    # Plain integer sums per resource: this loop runs over every pod of the node for every decision.
    counted = count_pods(pods, snapshot)
    request_cpu = request_memory = used_cpu = used_memory = max_cpu = max_memory = 0
    for pod, metric in counted.high_priority:
        cpu, memory = pod.request.get(_CPU, 0), pod.request.get(_MEMORY, 0)
        request_cpu += cpu
        request_memory += memory
        if metric is None:
            used_cpu += cpu  # into the usage sum but not into max(usage, request): Koordinator's asymmetry
            used_memory += memory
            continue
        usage_cpu, usage_memory = metric.usage.get(_CPU, 0), metric.usage.get(_MEMORY, 0)
        if pod.qos_class == vocab.QOS_LSE:
            used_cpu += cpu  # LSE pods hold their CPU request whatever they use
        else:
            used_cpu += usage_cpu
        used_memory += usage_memory
        max_cpu += max(cpu, usage_cpu)
        max_memory += max(memory, usage_memory)
    for metric in counted.dangling:
        usage_cpu, usage_memory = metric.usage.get(_CPU, 0), metric.usage.get(_MEMORY, 0)
        used_cpu += usage_cpu
        used_memory += usage_memory
        max_cpu += usage_cpu
        max_memory += usage_memory
    return _BatchSums(
        request={_CPU: request_cpu, _MEMORY: request_memory},
        used={_CPU: used_cpu, _MEMORY: used_memory},
        max_used_request={_CPU: max_cpu, _MEMORY: max_memory},
        accounting=counted.accounting,
    )


def _batch(
    node: _NodeFigures,
    pods: Sequence[kube.PodSummary],
    snapshot: NodeUsageSnapshot,
    strategy: strategies.ColocationStrategy,
) -> tuple[dict[str, ResourceExplanation], PodAccounting]:
    sums = _sum_high_priority_pods(pods, snapshot)
    capacity = node.capacity
    margin = {
        _CPU: scale(capacity[_CPU], _percent_ratio(100 - strategy.cpu_reclaim_threshold_percent)),
        _MEMORY: scale(capacity[_MEMORY], _percent_ratio(100 - strategy.memory_reclaim_threshold_percent)),
    }
    reserved = node.reserved
    system_used = resources.add(snapshot.system_usage, host_apps_used_above(snapshot, vocab.PRIORITY_BATCH))
    system_used = _cpu_and_memory(system_used)
    system_or_reserved = resources.max_rl(system_used, reserved)
    out: dict[str, ResourceExplanation] = {}
    for name, res, policy, percent, knob in (
        (vocab.BATCH_CPU, _CPU, strategy.cpu_calculate_policy, strategy.batch_cpu_threshold_percent, "batchCPU"),
        (
            vocab.BATCH_MEMORY,
            _MEMORY,
            strategy.memory_calculate_policy,
            strategy.batch_memory_threshold_percent,
            "batchMemory",
        ),
    ):
        if res == _CPU and policy == strategies.REQUEST:
            policy = strategies.USAGE  # Koordinator does not support `request` for CPU
        head = [("capacity", capacity[res]), ("safetyMargin", margin[res])]
        if policy == strategies.REQUEST:
            terms = [*head, ("nodeReserved", reserved[res]), ("podsHPRequest", sums.request[res])]
        elif policy == strategies.MAX_USAGE_REQUEST:
            terms = [
                *head,
                ("systemUsedOrReserved", system_or_reserved[res]),
                ("podsHPMaxUsedReq", sums.max_used_request[res]),
            ]
        else:
            policy = strategies.USAGE
            terms = [*head, ("systemUsedOrReserved", system_or_reserved[res]), ("podsHPUsed", sums.used[res])]
        value, formula, message = _difference(name, terms)
        value, formula, message, cap_terms = _capped(
            name, value, formula, message, capacity[res], percent, knob=f"{knob}ThresholdPercent"
        )
        out[name] = ResourceExplanation(
            value=value,
            formula=formula,
            message=message,
            policy=policy,
            terms={
                "capacity": capacity[res],
                "safetyMargin": margin[res],
                "systemUsed": system_used[res],
                "nodeReserved": reserved[res],
                "systemUsedOrReserved": system_or_reserved[res],
                "podsHPUsed": sums.used[res],
                "podsHPRequest": sums.request[res],
                "podsHPMaxUsedReq": sums.max_used_request[res],
                **cap_terms,
            },
        )
    return out, sums.accounting


# --- mid (§2.8)


def _mid_static(node: _NodeFigures, strategy: strategies.ColocationStrategy) -> dict[str, ResourceExplanation]:
    capacity = node.capacity
    out: dict[str, ResourceExplanation] = {}
    for name, res, reserved_percent, threshold_percent in (
        (vocab.MID_CPU, _CPU, strategy.mid_static_cpu_reserved_percent, strategy.mid_cpu_threshold_percent),
        (
            vocab.MID_MEMORY,
            _MEMORY,
            strategy.mid_static_memory_reserved_percent,
            strategy.mid_memory_threshold_percent,
        ),
    ):
        static = scale(capacity[res], _percent_ratio(reserved_percent))
        cap = scale(capacity[res], _percent_ratio(threshold_percent))
        value = min(static, cap)
        out[name] = ResourceExplanation(
            value=value,
            formula="min(capacity × staticReservedPercent/100, capacity × thresholdPercent/100)",
            terms={"capacity": capacity[res], "static": static, "cap": cap},
            message=(
                f"{name} {value} = min(capacity {capacity[res]} × {reserved_percent}% = {static}, "
                f"capacity {capacity[res]} × {threshold_percent}% = {cap})"
            ),
            policy=strategies.MID_RECLAIM_STATIC,
        )
    return out


def _mid_by_reclaimable(
    node: _NodeFigures,
    pods: Sequence[kube.PodSummary],
    snapshot: NodeUsageSnapshot,
    strategy: strategies.ColocationStrategy,
) -> dict[str, ResourceExplanation]:
    capacity = node.capacity
    reclaimable = _cpu_and_memory(snapshot.prod_reclaimable or {})
    system_used = resources.add(snapshot.system_usage, host_apps_used_above(snapshot, vocab.PRIORITY_MID))
    reserved = resources.max_rl(node.reserved, _cpu_and_memory(system_used))
    prod_cpu = prod_memory = 0
    for pod in pods:
        if pod.active and pod.priority_class not in _MID_OR_LOWER:
            prod_cpu += pod.request.get(_CPU, 0)
            prod_memory += pod.request.get(_MEMORY, 0)
    prod_allocated = {_CPU: prod_cpu, _MEMORY: prod_memory}
    unallocated = _cpu_and_memory(resources.sub_nonneg(resources.sub(capacity, reserved), prod_allocated))
    usage = snapshot.node_usage
    usage_valid = usage is not None and _CPU in usage and _MEMORY in usage
    unused = _cpu_and_memory(resources.sub(capacity, usage)) if usage is not None and usage_valid else {}
    notes = [
        *(["prodReclaimableMetric missing: counted as 0"] if snapshot.prod_reclaimable is None else []),
        *([] if usage_valid else ["nodeUsage lacks cpu or memory: nodeUnused counted as 0"]),
    ]
    out: dict[str, ResourceExplanation] = {}
    for name, res, threshold_percent in (
        (vocab.MID_CPU, _CPU, strategy.mid_cpu_threshold_percent),
        (vocab.MID_MEMORY, _MEMORY, strategy.mid_memory_threshold_percent),
    ):
        node_unused = _get(unused, res)
        reclaim = max(min(reclaimable[res], node_unused), 0)
        from_unallocated = scale(unallocated[res], _percent_ratio(strategy.mid_unallocated_percent))
        cap = scale(capacity[res], _percent_ratio(threshold_percent))
        value = min(reclaim + from_unallocated, cap)
        out[name] = ResourceExplanation(
            value=value,
            formula=(
                "min(max(min(prodReclaimable, nodeUnused), 0) + unallocated × midUnallocatedPercent/100, "
                "capacity × thresholdPercent/100)"
            ),
            terms={
                "prodReclaimable": reclaimable[res],
                "nodeUnused": node_unused,
                "unallocated": unallocated[res],
                "fromUnallocated": from_unallocated,
                "capacity": capacity[res],
                "nodeReserved": reserved[res],
                "prodAllocated": prod_allocated[res],
                "cap": cap,
            },
            message=(
                f"{name} {value} = min(max(min(prodReclaimable {reclaimable[res]}, nodeUnused {node_unused}), 0)"
                f" + unallocated {unallocated[res]} × {strategy.mid_unallocated_percent}% = {from_unallocated},"
                f" capacity {capacity[res]} × {threshold_percent}% = {cap})"
            ),
            policy="default",
            note="; ".join(notes),
        )
    return out


# --- the calculation


def _removed(names: Sequence[str], reason: str) -> dict[str, ResourceExplanation]:
    return {name: ResourceExplanation(value=None, reason=reason) for name in names}


def calculate(
    node: kube.Node,
    pods: Sequence[kube.PodSummary],
    node_metric: NodeUsageSnapshot | None,
    strategy: strategies.ColocationStrategy,
    now: float,
) -> NodeResourceResult:
    """Batch and mid resources for one node (§2.3 steps 3–6, §2.4, §2.8).

    `strategy` is the node's effective strategy; pass `enable=False` when the cluster strategy is disabled too
    (Koordinator requires both). `pods` are the node's pods as kube.summarize_pod gives them (not filtered by
    nodeName here; the service keeps one summary per pod version, since deriving classes and parsing quantities
    is most of the cost of a decision). `now` is Unix seconds. Disabled: all four removed. Missing or stale
    NodeMetric: batch and mid removed (degraded).
    """
    if not strategy.enable:
        return NodeResourceResult(resources=_removed(ALL_RESOURCES, REASON_DISABLED))
    if node_metric is None or is_degraded(node_metric, strategy, now):
        return NodeResourceResult(
            resources={
                **_removed(BATCH_RESOURCES, REASON_BATCH_DEGRADED),
                **_removed(MID_RESOURCES, REASON_MID_DEGRADED),
            }
        )
    figures = _NodeFigures(capacity=_cpu_and_memory(kube.node_capacity(node)), reserved=node_reserved(node))
    batch, accounting = _batch(figures, pods, node_metric, strategy)
    if node.status.allocatable is None:
        mid = _removed(MID_RESOURCES, REASON_NO_ALLOCATABLE)
    elif strategy.mid_reclaim_mode == strategies.MID_RECLAIM_STATIC:
        mid = _mid_static(figures, strategy)
    else:
        mid = _mid_by_reclaimable(figures, pods, node_metric, strategy)
    return NodeResourceResult(resources={**batch, **mid}, pods=accounting)


# --- prepare (§2.5)


def prepare(
    node: kube.Node, result: NodeResourceResult, *, cpu_normalization_ratio: str | None = None
) -> NodeResourcePatch:
    """What Koordinator writes on the Node for `result` (§2.5).

    `cpu_normalization_ratio` is the cpunormalization plugin's annotation value; None reads the node's own
    `node.koordinator.sh/cpu-normalization-ratio` annotation.
    """
    annotations = node.metadata.annotations
    if cpu_normalization_ratio is None:
        cpu_normalization_ratio = annotations.get(koordinator.ANNOTATION_CPU_NORMALIZATION_RATIO)
    ratio = koordinator.parse_cpu_normalization_ratio(cpu_normalization_ratio)
    written: dict[str, int | None] = {}
    steps: dict[str, list[str]] = {}
    for name, item in result.resources.items():
        steps[name] = []
        value = item.value
        if value is not None and name == vocab.BATCH_CPU and ratio is not None and ratio > 1.0:
            milli = scale(value * 1000, ratio)
            scaled = -(-milli // 1000)  # Kubernetes rounds a fractional quantity up
            steps[name].append(f"{value} × cpu-normalization-ratio {ratio} = {milli / 1000} → {scaled}")
            value = scaled
        written[name] = value
        if value is None:
            steps[name].append("removed from status.capacity and status.allocatable")
    origin = {name: _get_or_zero(written, name) for name in BATCH_RESOURCES}
    patch_annotations = {
        koordinator.ANNOTATION_ORIGIN_EXTENDED_ALLOCATABLE: koordinator.origin_extended_allocatable(annotations, origin)
    }
    third_party = koordinator.third_party_allocated(annotations, vocab.PRIORITY_BATCH)
    if third_party is not None and all(written.get(name) is not None for name in BATCH_RESOURCES):
        for name in BATCH_RESOURCES:
            allocated = _get(third_party, name)
            value = max(origin[name] - allocated, 0)
            steps[name].append(f"{origin[name]} − thirdPartyAllocations(koord-batch) {allocated} = {value}")
            written[name] = value
    return NodeResourcePatch(resources=written, annotations=patch_annotations, steps=steps)


def _get_or_zero(values: Mapping[str, int | None], name: str) -> int:
    value = values.get(name)
    return 0 if value is None else value


def apply_patch(current: Mapping[str, int], patch: NodeResourcePatch) -> resources.ResourceList:
    """A node's capacity or allocatable amounts after `patch`."""
    out = dict(current)
    for name, value in patch.resources.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out


# --- sync (§2.3 step 7)


def milli_value(amount: int) -> int:
    """The Kubernetes MilliValue() of our integer amount of a batch/mid resource (batch-cpu 25000 is 25000000).

    Every one of the four is written as a whole number (batch-cpu and mid-cpu count millicores, memory is bytes),
    so the quantity's MilliValue is the amount × 1000; a unit test checks this against the quantity round trip."""
    return amount * 1000


def is_resource_diff(old: Mapping[str, int], new: Mapping[str, int], name: str, threshold: float) -> bool:
    """Present in only one → diff; in neither → no diff; else |new − old| > old × threshold, in milli units."""
    if (name in old) != (name in new):
        return True
    if name not in old:
        return False
    old_milli, new_milli = milli_value(old[name]), milli_value(new[name])
    return abs(float(new_milli - old_milli)) > float(old_milli) * threshold


def needs_sync(
    old_allocatable: Mapping[str, int],
    new_allocatable: Mapping[str, int],
    *,
    strategy: strategies.ColocationStrategy,
    last_synced_at: float | None,
    now: float,
) -> SyncDecision:
    """Whether to write the node status: never written, or last written more than updateTimeThresholdSeconds
    ago, or a batch/mid resource moved by more than resourceDiffThreshold."""
    if last_synced_at is None:
        return SyncDecision(needed=True, reason="no status update recorded for this node")
    if now - last_synced_at > strategy.update_time_threshold_seconds:
        return SyncDecision(
            needed=True,
            reason=f"last update older than updateTimeThresholdSeconds {strategy.update_time_threshold_seconds}",
        )
    for name in ALL_RESOURCES:
        if is_resource_diff(old_allocatable, new_allocatable, name, strategy.resource_diff_threshold):
            return SyncDecision(
                needed=True,
                reason=f"{name} differs by more than resourceDiffThreshold {strategy.resource_diff_threshold}",
            )
    return SyncDecision(needed=False, reason="up to date")
