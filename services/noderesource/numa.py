"""NUMA-level batch resources (spec §2.7): per NodeResourceTopology zone, batch-cpu and batch-memory; pure.

For the noderesource service, the Kubernetes bridge and the writer. `calculate` (the node's pods as kube.PodSummary,
whose `numa_nodes` say where each is allocated) splits the node-level batch calculation of
services.noderesource.core across the N zones of the node's NodeResourceTopology (schemas.topology): each zone's
allocatable takes the place of the node capacity, its safety margin is computed from it, the node's system usage
(system + prod/mid host apps) and reservation are divided by N, and each high-priority pod's request and usage go to
the zones its `resource-status` annotation allocates it on (the ids below N; divided by the number of such entries),
or are divided across all N zones. Dangling pod metrics are divided across all N. The same three policies as the
node (usage, request, maxUsageRequest; cpu `request` is `usage`) and the same threshold caps give each zone's
result, with its formula and numbers (ResourceExplanation). `zone_entries` turns a result into the `resources` lists
to write on the NRT's zones, `needs_zone_update` decides whether that write is due.

Koordinator's arithmetic is kept to the unit: every division by N (or by the allocated zone count) rounds up in
milli units through float64, so a zone's memory can carry fractions of a byte (an NRT quantity such as
`1073741824500m`); `ZoneBatch.milli_values` holds the exact quantities, explanations show them in bytes. Quirks
kept on purpose: a high-priority pod without a metric adds its request to both the usage and the max(usage,
request) sums (the node-level asymmetry does not exist here); zones are addressed by position (NUMA id N is the
N-th zone); a pod listing the same NUMA id twice is divided by 2 and half of it is lost; fields of an NRT entry that
moved by no more than resourceDiffThreshold keep their old quantity even when the zone list is written.
Call the calculation only when the node-level batch calculation ran (not disabled, not degraded): Koordinator
leaves the NRT untouched otherwise. Amounts: cpu in millicores, memory in bytes. No I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Final

import msgspec

from schemas import koordinator, kube, quantity, resources, topology, vocab
from schemas.nodemetric_json import NodeUsageSnapshot
from schemas.noderesource import PodAccounting, ResourceExplanation
from services.noderesource import core
from services.noderesource import strategy as strategies

BATCH_RESOURCES: Final = core.BATCH_RESOURCES

_CPU, _MEMORY = resources.CPU, resources.MEMORY
_Pair = tuple[int, int]
"""(cpu, memory) in Kubernetes milli units: cpu millicores, memory thousandths of a byte."""


class ZoneBatch(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One zone's batch-cpu (millicores) and batch-memory (bytes, rounded up) with their explanations."""

    zone: str
    index: int
    """The zone's position in the NRT, which is the NUMA id pods are allocated by."""
    resources: dict[str, ResourceExplanation]
    milli_values: dict[str, int]
    """The exact Kubernetes MilliValue of each zone quantity before cpu normalization (batch-cpu: millicores ×
    1000, since the quantity counts millicores; batch-memory: thousandths of a byte)."""


class ZoneBatchResult(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    zones: tuple[ZoneBatch, ...]
    pods: PodAccounting = PodAccounting()

    def values(self) -> dict[str, dict[str, int | None]]:
        """Per zone name the resources' values (the last zone wins when two share a name, as in Koordinator)."""
        return {zone.zone: {name: item.value for name, item in zone.resources.items()} for zone in self.zones}


# --- arithmetic in milli units


def _div_up(milli: int, divisor: int) -> int:
    """Koordinator's DivideResourceList: `int64(math.Ceil(float64(milli) / divisor))`."""
    return math.ceil(float(milli) / divisor)


def _split(amounts: _Pair, numa_nodes: Sequence[int], zone_count: int) -> list[_Pair]:
    """A pod's amounts per zone: over its allocated zones (ids below `zone_count`, each entry counted), else all."""
    allocated_count = sum(1 for node in numa_nodes if 0 <= node < zone_count)
    if allocated_count <= 0:
        share = (_div_up(amounts[0], zone_count), _div_up(amounts[1], zone_count))
        return [share] * zone_count
    share = (_div_up(amounts[0], allocated_count), _div_up(amounts[1], allocated_count))
    allocated = set(numa_nodes)
    return [share if index in allocated else (0, 0) for index in range(zone_count)]


def _milli_pair(rl: Mapping[str, int]) -> _Pair:
    return rl.get(_CPU, 0), rl.get(_MEMORY, 0) * 1000


def _show(res: str, milli: int) -> str:
    """An amount for a message: cpu millicores; memory bytes, with the thousandths when there are any."""
    if res == _CPU or milli % 1000 == 0:
        return str(milli if res == _CPU else milli // 1000)
    sign = "-" if milli < 0 else ""
    whole, frac = divmod(abs(milli), 1000)
    return f"{sign}{whole}.{frac:03d}".rstrip("0")


def _display(res: str, milli: int) -> int:
    """An amount in our units: cpu millicores, memory bytes rounded up (Kubernetes Value())."""
    return milli if res == _CPU else -(-milli // 1000)


# --- the calculation


class _ZoneSums(msgspec.Struct, kw_only=True):
    request: list[list[int]]
    used: list[list[int]]
    max_used_request: list[list[int]]
    accounting: PodAccounting


def _add(target: list[list[int]], shares: Sequence[_Pair]) -> None:
    for zone, (cpu, memory) in zip(target, shares, strict=True):
        zone[0] += cpu
        zone[1] += memory


def _sum_zones(pods: Sequence[kube.PodSummary], snapshot: NodeUsageSnapshot, zone_count: int) -> _ZoneSums:
    counted = core.count_pods(pods, snapshot)
    request = [[0, 0] for _ in range(zone_count)]
    used = [[0, 0] for _ in range(zone_count)]
    max_used = [[0, 0] for _ in range(zone_count)]
    for pod, metric in counted.high_priority:
        zone_requests = _split(_milli_pair(pod.request), pod.numa_nodes, zone_count)
        _add(request, zone_requests)
        if metric is None:
            _add(used, zone_requests)  # into both sums here, unlike the node level
            _add(max_used, zone_requests)
            continue
        zone_usages = _split(_milli_pair(metric.usage), pod.numa_nodes, zone_count)
        if pod.qos_class == vocab.QOS_LSE:  # LSE pods hold their CPU request whatever they use
            _add(used, [(req[0], use[1]) for req, use in zip(zone_requests, zone_usages, strict=True)])
        else:
            _add(used, zone_usages)
        _add(
            max_used,
            [(max(req[0], use[0]), max(req[1], use[1])) for req, use in zip(zone_requests, zone_usages, strict=True)],
        )
    for metric in counted.dangling:
        cpu, memory = _milli_pair(metric.usage)
        share = [(_div_up(cpu, zone_count), _div_up(memory, zone_count))] * zone_count
        _add(used, share)
        _add(max_used, share)
    return _ZoneSums(request=request, used=used, max_used_request=max_used, accounting=counted.accounting)


def _cap_milli(res: str, capacity_milli: int, percent: int) -> int:
    """`capacity × percent/100` as Koordinator truncates it: cpu on millicores, memory on whole bytes."""
    if res == _CPU:
        return core.scale(capacity_milli, percent / 100)
    return core.scale(capacity_milli // 1000, percent / 100) * 1000


def _zone_resource(
    name: str,
    res: str,
    zone: str,
    *,
    policy: str,
    percent: int | None,
    knob: str,
    terms: Mapping[str, int],
    zone_count: int,
) -> tuple[ResourceExplanation, int]:
    """One zone's batch resource: the explanation and the exact milli value."""
    head = ["zoneAllocatable", "zoneSafetyMargin"]
    if policy == strategies.REQUEST:
        chosen = [*head, "zoneNodeReserved", "zonePodsHPRequest"]
    elif policy == strategies.MAX_USAGE_REQUEST:
        chosen = [*head, "zoneSystemUsedOrReserved", "zonePodsHPMaxUsedReq"]
    else:
        chosen = [*head, "zoneSystemUsedOrReserved", "zonePodsHPUsed"]
    raw = terms[chosen[0]] - sum(terms[term] for term in chosen[1:])
    value = max(raw, 0)
    formula = " − ".join(chosen)
    filled = " − ".join(f"{term} {_show(res, terms[term])}" for term in chosen)
    if raw < 0:
        filled = f"max({filled} = {_show(res, raw)}, 0)"
    cap_terms: dict[str, int] = {}
    if percent is not None:
        cap = _cap_milli(res, terms["zoneAllocatable"], percent)
        capped = min(value, cap)
        formula = f"min({formula}, zoneAllocatable × {knob}/100)"
        filled = (
            f"min({filled} = {_show(res, value)}, "
            f"zoneAllocatable {_show(res, terms['zoneAllocatable'])} × {percent}% = {_show(res, cap)})"
        )
        cap_terms = {"uncapped": _display(res, value), "cap": _display(res, cap)}
        value = capped
    fractional = res == _MEMORY and any(amount % 1000 for amount in (*terms.values(), value))
    explanation = ResourceExplanation(
        value=_display(res, value),
        formula=formula,
        message=f"{name} {zone} {_show(res, value)} = {filled}",
        policy=policy,
        terms={**{term: _display(res, amount) for term, amount in terms.items()}, "zones": zone_count, **cap_terms},
        note=(
            f"dividing by {zone_count} zones leaves fractions of a byte: terms are rounded up, the message is exact"
            if fractional
            else ""
        ),
    )
    return explanation, value


def calculate(
    node: kube.Node,
    pods: Sequence[kube.PodSummary],
    snapshot: NodeUsageSnapshot,
    strategy: strategies.ColocationStrategy,
    zones: Sequence[topology.NumaZone],
) -> ZoneBatchResult | None:
    """Per-zone batch resources (§2.7); None when there are no zones (no NRT, or none lists cpu or memory).

    `zones` are topology.numa_zones of the node's NRT, in its order; `pods` the node's pods (as for
    core.calculate; their `numa_nodes` say where each is allocated)."""
    zone_count = len(zones)
    if zone_count == 0 or all(zone.cpu is None and zone.memory is None for zone in zones):
        return None
    sums = _sum_zones(pods, snapshot, zone_count)
    system_used = resources.add(snapshot.system_usage, core.host_apps_used_above(snapshot, vocab.PRIORITY_BATCH))
    system_milli = _milli_pair(system_used)
    reserved_milli = _milli_pair(core.node_reserved(node))
    zone_system = (_div_up(system_milli[0], zone_count), _div_up(system_milli[1], zone_count))
    zone_reserved = (_div_up(reserved_milli[0], zone_count), _div_up(reserved_milli[1], zone_count))
    cpu_policy = strategy.cpu_calculate_policy
    if cpu_policy not in (strategies.USAGE, strategies.MAX_USAGE_REQUEST):
        cpu_policy = strategies.USAGE  # Koordinator does not support `request` for CPU
    memory_policy = strategy.memory_calculate_policy
    if memory_policy not in (strategies.USAGE, strategies.REQUEST, strategies.MAX_USAGE_REQUEST):
        memory_policy = strategies.USAGE
    out: list[ZoneBatch] = []
    for index, zone in enumerate(zones):
        allocatable = (zone.cpu or 0, (zone.memory or 0) * 1000)
        margin = (
            core.scale(allocatable[0], (100 - strategy.cpu_reclaim_threshold_percent) / 100),
            core.scale(allocatable[1] // 1000, (100 - strategy.memory_reclaim_threshold_percent) / 100) * 1000,
        )
        explained: dict[str, ResourceExplanation] = {}
        milli_values: dict[str, int] = {}
        for i, (name, res, policy, percent, knob) in enumerate(
            (
                (vocab.BATCH_CPU, _CPU, cpu_policy, strategy.batch_cpu_threshold_percent, "batchCPUThresholdPercent"),
                (
                    vocab.BATCH_MEMORY,
                    _MEMORY,
                    memory_policy,
                    strategy.batch_memory_threshold_percent,
                    "batchMemoryThresholdPercent",
                ),
            )
        ):
            terms = {
                "zoneAllocatable": allocatable[i],
                "zoneSafetyMargin": margin[i],
                "zoneSystemUsed": zone_system[i],
                "zoneNodeReserved": zone_reserved[i],
                "zoneSystemUsedOrReserved": max(zone_system[i], zone_reserved[i]),
                "zonePodsHPUsed": sums.used[index][i],
                "zonePodsHPRequest": sums.request[index][i],
                "zonePodsHPMaxUsedReq": sums.max_used_request[index][i],
            }
            explained[name], milli = _zone_resource(
                name, res, zone.name, policy=policy, percent=percent, knob=knob, terms=terms, zone_count=zone_count
            )
            milli_values[name] = milli * 1000 if res == _CPU else milli
        out.append(ZoneBatch(zone=zone.name, index=index, resources=explained, milli_values=milli_values))
    return ZoneBatchResult(zones=tuple(out), pods=sums.accounting)


# --- writing the zones (Koordinator's UpdateNRTZoneListIfNeeded) and deciding the write


def _milli_of(raw: quantity.RawQuantity) -> int:
    return quantity.milli_value(quantity.parse_quantity(raw))


def _quantity_text(name: str, milli: int) -> str:
    fmt = quantity.BINARY_SI if name == vocab.BATCH_MEMORY else quantity.DECIMAL_SI
    return quantity.format_quantity(quantity.Quantity(Fraction(milli, 1000), fmt))


def _is_quantity_diff(old_milli: int, new_milli: int, threshold: float) -> bool:
    return abs(float(new_milli - old_milli)) > float(old_milli) * threshold


def zone_milli_values(result: ZoneBatchResult, *, cpu_normalization_ratio: str | None) -> dict[str, dict[str, int]]:
    """Per zone name the MilliValue of each quantity to write: batch-cpu × the cpu-normalization ratio when it
    parses to more than 1 (milli truncation, no rounding to a whole number on the NRT), batch-memory as computed."""
    ratio = koordinator.parse_cpu_normalization_ratio(cpu_normalization_ratio)
    out: dict[str, dict[str, int]] = {}
    for zone in result.zones:
        values = dict(zone.milli_values)
        if ratio is not None and ratio > 1.0:
            values[vocab.BATCH_CPU] = core.scale(values[vocab.BATCH_CPU], ratio)
        out[zone.zone] = values
    return out


def zone_entries(
    zones: Sequence[topology.Zone],
    result: ZoneBatchResult,
    *,
    cpu_normalization_ratio: str | None,
    diff_threshold: float,
) -> list[topology.Zone]:
    """The NRT's `zones` (as last read) with their batch entries as Koordinator writes them, in the same order.

    A zone with a result: each batch-cpu/batch-memory entry gets capacity = allocatable = available = the zone's
    quantity (`zone_milli_values`), except fields that moved by no more than `diff_threshold`, which keep their
    old text; a missing entry is added and the zone's list sorted by name. A zone without a result: batch entries
    it lists are set to zero (none added), as spec §2.7 says; Koordinator means to, but its loop zeroes copies of
    the entries, so it only rewrites them unchanged. Other resources are left as they are. The writer copies each
    zone's `resources` onto the object (the other zone fields are not modelled here)."""
    values = zone_milli_values(result, cpu_normalization_ratio=cpu_normalization_ratio)
    out: list[topology.Zone] = []
    for zone in zones:
        entries = list(zone.resources or ())
        zone_values = values.get(zone.name)
        if zone_values is None:
            for j, info in enumerate(entries):
                if info.name in BATCH_RESOURCES and any(
                    _milli_of(raw) != 0 for raw in (info.capacity, info.allocatable, info.available)
                ):
                    entries[j] = topology.ResourceInfo(name=info.name, capacity="0", allocatable="0", available="0")
            out.append(msgspec.structs.replace(zone, resources=entries))
            continue
        added = False
        for name in BATCH_RESOURCES:
            milli = zone_values[name]
            text = _quantity_text(name, milli)
            position = next((j for j, info in enumerate(entries) if info.name == name), None)
            if position is None:
                entries.append(topology.ResourceInfo(name=name, capacity=text, allocatable=text, available=text))
                added = True
                continue
            old = entries[position]
            fields = {
                field: text if _is_quantity_diff(_milli_of(raw), milli, diff_threshold) else raw
                for field, raw in (
                    ("capacity", old.capacity),
                    ("allocatable", old.allocatable),
                    ("available", old.available),
                )
            }
            entries[position] = topology.ResourceInfo(name=name, **fields)
        if added:
            entries.sort(key=lambda info: info.name)
        out.append(msgspec.structs.replace(zone, resources=entries))
    return out


def needs_zone_update(
    old: Sequence[topology.Zone],
    new: Sequence[topology.Zone],
    threshold: float,
    last_update_at: float | None,
    now: float,
    update_time_threshold_seconds: int,
) -> core.SyncDecision:
    """Whether to write the NRT (§2.7): a batch entry of `new` is missing from `old`, one of its fields moved by
    more than `threshold` (|new − old| > old × threshold in milli units) or was reset to zero; else when it was
    never written or `last_update_at` is more than `update_time_threshold_seconds` before `now`.

    `old` is the NRT's zones as read, `new` what `zone_entries` made of them (zones matched by name). Koordinator
    records `last_update_at` after every reconcile that reached this step with zones calculated, whether or not it
    wrote, so the time rule only fires for a node not reconciled for that long."""
    old_entries = {zone.name: topology.batch_entries(zone, BATCH_RESOURCES) for zone in old}
    for zone in new:
        before = old_entries.get(zone.name, {})
        for name, info in topology.batch_entries(zone, BATCH_RESOURCES).items():
            previous = before.get(name)
            if previous is None:
                return core.SyncDecision(needed=True, reason=f"{name} added to zone {zone.name}")
            for field in ("capacity", "allocatable", "available"):
                old_milli, new_milli = _milli_of(getattr(previous, field)), _milli_of(getattr(info, field))
                if _is_quantity_diff(old_milli, new_milli, threshold) or (old_milli != 0 and new_milli == 0):
                    return core.SyncDecision(
                        needed=True,
                        reason=f"{name} {field} of zone {zone.name} differs by more than resourceDiffThreshold "
                        f"{threshold}",
                    )
    if last_update_at is None:
        return core.SyncDecision(needed=True, reason="no NodeResourceTopology update recorded for this node")
    if now - last_update_at > update_time_threshold_seconds:
        return core.SyncDecision(
            needed=True, reason=f"last NRT update older than updateTimeThresholdSeconds {update_time_threshold_seconds}"
        )
    return core.SyncDecision(needed=False, reason="up to date")
