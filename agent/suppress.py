"""BE CPU suppress (spec §5.5.1), computed: how much CPU BE pods may use now, and what to write for it. Pure.

`be_allowance` is Koordinator's suppress formula — node capacity × cpuSuppressThresholdPercent, minus what the
non-BE pods and the system use now (system = node − all pods, at least the node's reserved CPU), floored at
cpuSuppressMinPercent of the capacity when set — with the terms, so an event can say why. The cfsQuota policy turns
it into the besteffort cgroup's CFS quota (`cfs_quota_target`: at least 2000 µs, small moves skipped, growth per
round capped at 10% of the node); the cpuset policy into a number of CPUs (`cpuset_size`: at least 2, growth per
round capped at 10% of the logical CPUs) picked by `pick_cpus` — spread over NUMA nodes and sockets, hyper-thread
siblings together. `parse_cpuset` / `format_cpuset` read and write the kernel's list format ("0-3,8").

CPUs BE must never get (issue 23, point 3; §5.5.1 step 1): the kubelet's reserved CPUs (`--reserved-cpus` /
reservedSystemCPUs, or the reservedCPUs of Koordinator's node reservation annotation: the agent's `reserved_cpus`
setting) and the CPUs the scheduler allocated to LSE pods (their `scheduling.koordinator.sh/resource-status`
cpuset). `be_cpu_pools` leaves those out and splits the rest into the LSR pool (CPUs allocated to LSR pods) and the
shared LS pool; `pick_be_cpus` takes a share of the suppress size from each in proportion to its size
(lsrCount = floor(n × |LSR| / (|LSR| + |LS|))), as koordlet does, so BE pods lean on the shared pool first.

`psi_step` is koordbus's own opt-in rule (issue 23, point 6; off by default): when the highest CPU `some` stall ratio
among the LS pods (QoS LSE, LSR or LS, the kube QoS deciding where no koord label does) reaches a threshold, the BE
allowance is lowered by a step of the capacity, before the cpuSuppressMinPercent floor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from agent.actuate import NodePod
from schemas import kube, vocab

MIN_QUOTA_US: Final = 2000
QUOTA_PERIOD_US: Final = 100000
MIN_CPUS: Final = 2
MAX_CPU_ID: Final = 8191
"""The highest CPU id a cpu list may name (Linux's largest NR_CPUS is 8192): a list from a pod annotation or a file
cannot make a set of a billion ids."""


@dataclass(frozen=True, kw_only=True)
class Allowance:
    milli: int
    """CPU BE pods may use, in millicores (may be negative without a floor)."""
    explanation: str


def is_be(node_pod: NodePod) -> bool:
    """BE for suppress: the koord QoS label BE, or kube QoS BestEffort."""
    labels = node_pod.pod.metadata.labels
    return (
        labels.get(vocab.QOS_CLASS_LABEL) == vocab.QOS_BE or node_pod.pod.status.qos_class == vocab.KUBE_QOS_BESTEFFORT
    )


@dataclass(frozen=True, kw_only=True)
class PsiRule:
    """The opt-in PSI suppress rule: `threshold` an LS pod's CPU some stall ratio in (0, 1], `step_percent` of the
    capacity taken off BE's allowance while some LS pod is at or above it."""

    threshold: float
    step_percent: float


@dataclass(frozen=True, kw_only=True)
class PsiStep:
    milli: int
    explanation: str


_LS_CLASSES: Final = frozenset((vocab.QOS_LSE, vocab.QOS_LSR, vocab.QOS_LS))


def psi_step(
    rule: PsiRule | None, *, cpu_some: Mapping[str, float], pods: Iterable[NodePod], capacity_milli: int
) -> PsiStep | None:
    """What the PSI rule takes off BE's allowance (`cpu_some`: uid → the pod's latest CPU some stall ratio); None when
    the rule is off, no LS pod has a ratio, or none reaches the threshold."""
    if rule is None:
        return None
    ls = {
        p.uid
        for p in pods
        if vocab.qos_class_with_default(p.pod.metadata.labels, p.pod.status.qos_class) in _LS_CLASSES
    }
    ratios = [(ratio, uid) for uid, ratio in cpu_some.items() if uid in ls]
    if not ratios:
        return None
    worst, uid = max(ratios)
    if worst < rule.threshold:
        return None
    milli = int(capacity_milli * rule.step_percent / 100)
    return PsiStep(
        milli=milli,
        explanation=f"LS CPU pressure step {milli}m ({rule.step_percent:g}%: pod {uid} cpu some {worst:.3f} ≥ "
        f"{rule.threshold:g})",
    )


def be_allowance(
    *,
    capacity_milli: int,
    node_used_milli: int,
    pod_used_milli: Mapping[str, int],
    pods: Iterable[NodePod],
    threshold_percent: float,
    min_percent: float | None,
    node_reserved_milli: int = 0,
    pressure: PsiStep | None = None,
) -> Allowance:
    """`pod_used_milli`: uid → usage of every pod with a sample; a sampled pod the pod list does not know counts
    as non-BE (it could be anything). `pressure` (psi_step) is taken off before the floor."""
    be_uids = {p.uid for p in pods if is_be(p)}
    all_pods = sum(pod_used_milli.values())
    non_be = sum(used for uid, used in pod_used_milli.items() if uid not in be_uids)
    system = max(max(node_used_milli - all_pods, 0), node_reserved_milli)
    allowed = int(capacity_milli * threshold_percent / 100) - non_be - system
    text = f"{capacity_milli}m × {threshold_percent:g}% − non-BE pods {non_be}m − system {system}m"
    if pressure is not None:
        allowed -= pressure.milli
        text += f" − {pressure.explanation}"
    text += f" = {allowed}m"
    if min_percent is not None:
        floor = int(capacity_milli * min_percent / 100)
        if floor > allowed:
            text += f", raised to cpuSuppressMinPercent {min_percent:g}% = {floor}m"
            allowed = floor
    return Allowance(milli=allowed, explanation=text)


def cfs_quota_target(allowed_milli: int, *, current: int, cpus: int) -> int | None:
    """The besteffort CFS quota to write; None when the move is too small to bother (under 1% of the node)."""
    target = max(allowed_milli * QUOTA_PERIOD_US // 1000, MIN_QUOTA_US)
    node_quota = cpus * QUOTA_PERIOD_US
    if current != -1 and target > current:
        target = min(target, current + node_quota // 10)
    if current != -1 and abs(target - current) < node_quota // 100 and target != MIN_QUOTA_US:
        return None
    return target


def cpuset_size(allowed_milli: int, *, old_size: int, logical_cpus: int) -> int:
    size = max(math.ceil(allowed_milli / 1000), MIN_CPUS)
    size = min(size, old_size + math.ceil(0.1 * logical_cpus))
    return min(size, logical_cpus)


@dataclass(frozen=True, kw_only=True)
class Cpu:
    id: int
    core: int
    socket: int
    numa: int


def pick_cpus(cpus: Sequence[Cpu], count: int) -> list[int]:
    """`count` CPUs: buckets per (NUMA node, socket), largest first; hyper-thread sibling pairs round-robin over the
    buckets while two or more are needed, then single CPUs round-robin. Sorted ids."""
    buckets: dict[tuple[int, int], list[Cpu]] = {}
    for cpu in cpus:
        buckets.setdefault((cpu.numa, cpu.socket), []).append(cpu)
    ordered = sorted(
        (sorted(b, key=lambda c: (c.core, c.id)) for b in buckets.values()), key=lambda b: (-len(b), b[0].id)
    )
    taken: list[int] = []
    remaining = min(count, len(cpus))
    progress = True
    while remaining >= 2 and progress:
        progress = False
        for bucket in ordered:
            if remaining < 2:
                break
            pair = _sibling_pair(bucket)
            if pair is not None:
                for cpu in pair:
                    bucket.remove(cpu)
                    taken.append(cpu.id)
                remaining -= 2
                progress = True
    while remaining > 0 and any(ordered):
        for bucket in ordered:
            if remaining == 0:
                break
            if bucket:
                taken.append(bucket.pop(0).id)
                remaining -= 1
    return sorted(taken)


def _sibling_pair(bucket: list[Cpu]) -> tuple[Cpu, Cpu] | None:
    for i, cpu in enumerate(bucket):
        for other in bucket[i + 1 :]:
            if other.core == cpu.core:
                return cpu, other
    return None


def parse_cpuset(text: str) -> set[int]:
    """The kernel's cpu list ("0-3,8,10-11"); ValueError when malformed."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, sep, high = part.partition("-")
        first, last = int(low), int(high) if sep else int(low)
        if last < first or first < 0:
            raise ValueError(f"bad cpu range {part!r}")
        if last > MAX_CPU_ID:
            raise ValueError(f"cpu {last} in {part!r} is above {MAX_CPU_ID}")
        out.update(range(first, last + 1))
    return out


def format_cpuset(ids: Iterable[int]) -> str:
    ordered = sorted(set(ids))
    runs: list[str] = []
    start = prev = None
    for cpu in ordered:
        if prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            runs.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = cpu
    if start is not None:
        runs.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(runs)


# --- CPUs BE must not get


@dataclass(frozen=True, kw_only=True)
class BeCpuPools:
    """Where BE pods may run: the LSR pool and the shared LS pool (Cpu records), and what was left out, with why."""

    lsr: list[Cpu]
    ls: list[Cpu]
    excluded: dict[int, str]
    """CPU id → why BE may not have it (reserved, or an LSE pod's)."""

    @property
    def ids(self) -> set[int]:
        return {c.id for c in (*self.lsr, *self.ls)}

    def why_not(self) -> str:
        """The exclusions in a few words, for an actuation's reason ("" when none)."""
        if not self.excluded:
            return ""
        groups: dict[str, set[int]] = {}
        for cpu, why in self.excluded.items():
            groups.setdefault(why, set()).add(cpu)
        return "; not " + ", ".join(f"{why} {format_cpuset(ids)}" for why, ids in sorted(groups.items()))


def allocated_cpuset(pod: NodePod) -> set[int]:
    """The CPUs the scheduler allocated the pod (its resource-status annotation's cpuset); empty when it has none or
    the annotation does not parse (a hostile or broken annotation excludes nothing, rather than everything)."""
    text = kube.resource_status_cpuset(pod.pod.metadata.annotations)
    if not text:
        return set()
    try:
        return parse_cpuset(text)
    except ValueError:
        return set()


def be_cpu_pools(cpus: Sequence[Cpu], pods: Sequence[NodePod], *, reserved: frozenset[int]) -> BeCpuPools:
    """Every logical CPU minus the reserved ones and the LSE pods' allocations, split into the LSR pool (the LSR pods'
    allocations) and the LS pool (the rest). Pods that finished hold nothing."""
    lse: set[int] = set()
    lsr: set[int] = set()
    for pod in pods:
        if pod.pod.status.phase in (kube.PHASE_SUCCEEDED, kube.PHASE_FAILED):
            continue
        qos = pod.koord_qos
        if qos == vocab.QOS_LSE:
            lse |= allocated_cpuset(pod)
        elif qos == vocab.QOS_LSR:
            lsr |= allocated_cpuset(pod)
    excluded: dict[int, str] = {}
    for cpu in cpus:
        if cpu.id in reserved:
            excluded[cpu.id] = "reserved"
        elif cpu.id in lse:
            excluded[cpu.id] = "LSE pods'"
    kept = [c for c in cpus if c.id not in excluded]
    return BeCpuPools(lsr=[c for c in kept if c.id in lsr], ls=[c for c in kept if c.id not in lsr], excluded=excluded)


def pick_be_cpus(pools: BeCpuPools, count: int) -> list[int]:
    """`count` CPUs (at most every CPU of the pools): from the LSR pool its share floor(count × |LSR| / (|LSR| +
    |LS|)), the rest from the LS pool, each picked by `pick_cpus`; if one pool runs short the other gives more."""
    total = len(pools.lsr) + len(pools.ls)
    count = min(count, total)
    if total == 0:
        return []
    lsr_count = count * len(pools.lsr) // total
    ls_count = min(count - lsr_count, len(pools.ls))
    lsr_count = count - ls_count
    return sorted(pick_cpus(pools.lsr, lsr_count) + pick_cpus(pools.ls, ls_count))
