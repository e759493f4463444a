"""BE CPU suppress (spec §5.5.1), computed: how much CPU BE pods may use now, and what to write for it. Pure.

`be_allowance` is Koordinator's suppress formula — node capacity × cpuSuppressThresholdPercent, minus what the
non-BE pods and the system use now (system = node − all pods, at least the node's reserved CPU), floored at
cpuSuppressMinPercent of the capacity when set — with the terms, so an event can say why. The cfsQuota policy turns
it into the besteffort cgroup's CFS quota (`cfs_quota_target`: at least 2000 µs, small moves skipped, growth per
round capped at 10% of the node); the cpuset policy into a number of CPUs (`cpuset_size`: at least 2, growth per
round capped at 10% of the logical CPUs) picked by `pick_cpus` — spread over NUMA nodes and sockets, hyper-thread
siblings together. `parse_cpuset` / `format_cpuset` read and write the kernel's list format ("0-3,8").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from agent.actuate import NodePod
from schemas import vocab

MIN_QUOTA_US: Final = 2000
QUOTA_PERIOD_US: Final = 100000
MIN_CPUS: Final = 2


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


def be_allowance(
    *,
    capacity_milli: int,
    node_used_milli: int,
    pod_used_milli: Mapping[str, int],
    pods: Iterable[NodePod],
    threshold_percent: float,
    min_percent: float | None,
    node_reserved_milli: int = 0,
) -> Allowance:
    """`pod_used_milli`: uid → usage of every pod with a sample; a sampled pod the pod list does not know counts
    as non-BE (it could be anything)."""
    be_uids = {p.uid for p in pods if is_be(p)}
    all_pods = sum(pod_used_milli.values())
    non_be = sum(used for uid, used in pod_used_milli.items() if uid not in be_uids)
    system = max(max(node_used_milli - all_pods, 0), node_reserved_milli)
    allowed = int(capacity_milli * threshold_percent / 100) - non_be - system
    text = f"{capacity_milli}m × {threshold_percent:g}% − non-BE pods {non_be}m − system {system}m = {allowed}m"
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
