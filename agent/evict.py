"""Which pods the agent asks to evict, and why (spec §5.5.2 memory eviction, §5.5.3 BE CPU satisfaction eviction).
Pure.

Memory (`memory_victims`): when node memory use (MemTotal − MemAvailable, integer percent of the total) reaches
memoryEvictThresholdPercent, release capacity × (use% − lower%) / 100, lower% = memoryEvictLowerPercent or
threshold − 2. Features run in order, never picking a pod twice, adding up what they release:
* BEMemoryEvict — pods labelled BE, by spec.priority ascending (when both set and different), then memory use
  descending (pods without a sample last), then name descending; each releases its memory use.
* MemoryEvict (needs evictEnabledPriorityThreshold) — active pods at or under that priority value, labelled
  `koordinator.sh/eviction-enabled: "true"`, with a memory sample; by the `koordinator.sh/eviction-priority`
  annotation, priority value, `koordinator.sh/priority` label (all ascending), then memory use descending. Koordinator
  counts each victim's release as bytes × 1000 (the spec flags it), so one victim always "releases" enough; we count
  bytes, deliberately: the node gets back what it needs, not one pod per round whatever the pressure.
A pod's `koordinator.sh/eviction-policy` annotation (a JSON list of feature names) limits which features may pick it.
Pods whose eviction was already requested but that are still there count as released up front.

BE CPU satisfaction (`cpu_satisfaction_release`, `cpu_victims`): over a window of (BE usage, BE batch-cpu request,
BE real limit) samples, when BE uses at least cpuEvictBEUsageThresholdPercent of its limit and limit / request falls
to cpuEvictBESatisfactionLowerPercent or below, release request × (upper% − satisfaction) millicores — the lesser of
the window average's and the latest sample's answer when request or limit moved. Victims: BE pods by spec.priority
ascending, else usage / request descending; each releases its batch-cpu request.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from agent import evict_strategy, qos
from agent.actuate import NodePod
from schemas import vocab
from schemas.qos import Change, PodEvictionRequested

BE_MEMORY: Final = "BEMemoryEvict"
MEMORY: Final = "MemoryEvict"
BE_CPU: Final = "BECPUEvict"
CPU: Final = "CPUEvict"
CPU_ALLOCATABLE: Final = "CPUAllocatableEvict"
MEMORY_ALLOCATABLE: Final = "MemoryAllocatableEvict"
"""Koordinator's features for batch/mid pods past the node's batch/mid allocatable (a simulated node also evicts by
them when its batch allocatable shrinks, agent.simulate)."""
FEATURES: Final = frozenset({BE_MEMORY, MEMORY, BE_CPU, CPU, MEMORY_ALLOCATABLE, CPU_ALLOCATABLE})
"""The features the agent's loops evict by (the --evict setting names some of them)."""
EVICTION_POLICY: Final = "koordinator.sh/eviction-policy"
EVICTION_ENABLED: Final = "koordinator.sh/eviction-enabled"
EVICTION_PRIORITY: Final = "koordinator.sh/eviction-priority"
PRIORITY_LABEL: Final = "koordinator.sh/priority"
DEFAULT_BE_USAGE_THRESHOLD: Final = 90
REQUESTED: Final = "eviction requested"
WOULD_REQUEST: Final = "eviction would be requested"
"""What an eviction loop's Change says happened to a victim: its request published, or in dry-run nothing."""


@dataclass(frozen=True, kw_only=True)
class Victim:
    pod: NodePod
    feature: str
    released: int
    """Bytes (memory) or millicores (CPU) its eviction is counted to give back."""
    reason: str


def eviction_request(*, node: str, at: float, pod: NodePod, feature: str, reason: str) -> PodEvictionRequested:
    """What a node asks the bridge for to evict `pod` (by name, with its uid as the precondition): built here for
    the agent's loops (agent.loops.evict) and a simulated node's evictions (agent.simulate) alike."""
    meta = pod.pod.metadata
    return PodEvictionRequested(
        node=node, at=at, namespace=meta.namespace, name=meta.name, uid=meta.uid, feature=feature, reason=reason
    )


def eviction_change(request: PodEvictionRequested, outcome: str) -> Change:
    """The Change an eviction loop's ActuationApplied reports for a pod it asked (or in dry-run would ask) to evict,
    with what happened: the agent's loops (agent.loops.evict) and a simulated node's (agent.simulate_qos) alike."""
    return Change(
        path=f"pods/{request.namespace}/{request.name}", before="running", after=outcome, reason=request.reason
    )


def allowed(node_pod: NodePod, feature: str) -> bool:
    """The eviction-policy annotation lets `feature` act on the pod (absent or unreadable: yes)."""
    text = node_pod.pod.metadata.annotations.get(EVICTION_POLICY)
    if not text:
        return True
    try:
        policy = json.loads(text)
    except ValueError:
        return True
    return not isinstance(policy, list) or feature in policy


def _is_be_label(node_pod: NodePod) -> bool:
    return node_pod.pod.metadata.labels.get(vocab.QOS_CLASS_LABEL) == vocab.QOS_BE


def _name_key(name: str) -> tuple[int, ...]:
    """Sorts names descending when used ascending."""
    return (*(-ord(c) for c in name), 1)


def memory_victims(
    *,
    features: frozenset[str],
    capacity: int,
    node_used: int,
    pod_memory: Mapping[str, int],
    pods: Sequence[NodePod],
    threshold_percent: int,
    lower_percent: int | None,
    priority_threshold: int | None,
    pending: Iterable[str] = (),
) -> tuple[list[Victim], str]:
    """(victims in order, explanation); no victims below the threshold."""
    if capacity <= 0:
        return [], "memory capacity unknown"
    usage_percent = node_used * 100 // capacity
    lower = lower_percent if lower_percent is not None else threshold_percent - 2
    if usage_percent < threshold_percent:
        return [], f"node memory {usage_percent}% < threshold {threshold_percent}%"
    to_release = capacity * (usage_percent - lower) // 100
    pending_set = set(pending)
    released = sum(pod_memory.get(p.uid, 0) for p in pods if p.uid in pending_set)
    explanation = (
        f"node memory {usage_percent}% ≥ threshold {threshold_percent}%: release {to_release} bytes "
        f"(to {lower}%), {released} already pending"
    )
    victims: list[Victim] = []
    taken = set(pending_set)
    for feature, candidates in (
        (BE_MEMORY, _be_memory_order(pods, pod_memory) if BE_MEMORY in features else []),
        (MEMORY, _memory_order(pods, pod_memory, priority_threshold) if MEMORY in features else []),
    ):
        for node_pod in candidates:
            if released >= to_release:
                break
            if node_pod.uid in taken or not allowed(node_pod, feature):
                continue
            used = pod_memory.get(node_pod.uid, 0)
            taken.add(node_pod.uid)
            released += used
            reason = f"{feature}: {explanation}; this pod uses {used} bytes"
            victims.append(Victim(pod=node_pod, feature=feature, released=used, reason=reason))
    return victims, explanation


def _active(node_pod: NodePod) -> bool:
    return node_pod.pod.status.phase in ("Running", "Pending")


def _be_memory_order(pods: Sequence[NodePod], pod_memory: Mapping[str, int]) -> list[NodePod]:
    candidates = [p for p in pods if _is_be_label(p) and _active(p)]

    def key(p: NodePod) -> tuple[object, ...]:
        used = pod_memory.get(p.uid, 0)
        priority = p.pod.spec.priority
        return (priority if priority is not None else 0, used <= 0, -used, _name_key(p.pod.metadata.name))

    # "spec.priority ascending when both are set and differ": a pod without priority sorts as 0, which only
    # differs from a set value where Koordinator would have compared them.
    return sorted(candidates, key=key)


def _memory_order(
    pods: Sequence[NodePod], pod_memory: Mapping[str, int], priority_threshold: int | None
) -> list[NodePod]:
    return _priority_order(pods, pod_memory, priority_threshold)


def _priority_order(
    pods: Sequence[NodePod], pod_usage: Mapping[str, int], priority_threshold: int | None
) -> list[NodePod]:
    """MemoryEvict's (and CPUEvict's) candidates and order: active pods labelled eviction-enabled, with a usage
    sample, at or under the priority threshold; by eviction-priority annotation, spec.priority, the priority label,
    then the most used first."""
    if priority_threshold is None:
        return []
    candidates = [
        p
        for p in pods
        if _active(p)
        and p.pod.metadata.labels.get(EVICTION_ENABLED) == "true"
        and p.uid in pod_usage
        and (p.pod.spec.priority or 0) <= priority_threshold
    ]

    def key(p: NodePod) -> tuple[int, int, int, int]:
        return (
            _int(p.pod.metadata.annotations.get(EVICTION_PRIORITY)),
            p.pod.spec.priority or 0,
            _int(p.pod.metadata.labels.get(PRIORITY_LABEL)),
            -pod_usage.get(p.uid, 0),
        )

    return sorted(candidates, key=key)


def node_cpu_victims(
    *,
    capacity_milli: int,
    window: Sequence[tuple[float, int]],
    pod_cpu: Mapping[str, int],
    pods: Sequence[NodePod],
    threshold_percent: int,
    lower_percent: int | None,
    priority_threshold: int | None,
    taken: Iterable[str] = (),
) -> tuple[list[Victim], str]:
    """CPUEvict (§5.5.3): the node's CPU over the window — (time, millicores) samples, averaged — as a percent of
    its capacity; at or over the threshold, pods in MemoryEvict's order (by CPU used) until what they use covers
    capacity × (percent − lower) / 100 (lower: threshold − 2 when unset). `taken`: pods already asked for (by an
    earlier eviction, or BECPUEvict this round): skipped, and not counted."""
    if capacity_milli <= 0 or not window:
        return [], "no node CPU samples in the window"
    average = sum(milli for _, milli in window) / len(window)
    trigger = evict_strategy.usage_release(
        capacity=capacity_milli, used=average, threshold=threshold_percent, lower=lower_percent
    )
    if not trigger.triggered:
        return [], f"node CPU {trigger.percent}% < threshold {threshold_percent}%"
    explanation = (
        f"node CPU {trigger.percent}% over {len(window)} samples ≥ threshold {threshold_percent}%: release "
        f"{trigger.release}m (to {trigger.lower}%)"
    )
    skip = set(taken)
    victims: list[Victim] = []
    released = 0
    for node_pod in _priority_order(pods, pod_cpu, priority_threshold):
        if released >= trigger.release:
            break
        if node_pod.uid in skip or not allowed(node_pod, CPU):
            continue
        used = pod_cpu.get(node_pod.uid, 0)
        released += used
        reason = f"{CPU}: {explanation}; this pod uses {used}m"
        victims.append(Victim(pod=node_pod, feature=CPU, released=used, reason=reason))
    return victims, explanation


def _int(text: str | None) -> int:
    try:
        return int(text) if text else 0
    except ValueError:
        return 0


# --- BE CPU satisfaction (§5.5.3)


@dataclass(frozen=True, kw_only=True)
class CpuSample:
    at: float
    usage: int
    """BE pods' CPU use, millicores."""
    request: int
    """Σ batch-cpu requests of BE pods, millicores."""
    limit: int
    """BE real limit: min(CPUs in the BE cpuset × 1000, CFS quota in millicores)."""


def be_request_milli(pods: Iterable[NodePod]) -> int:
    total = 0
    for node_pod in pods:
        if not _is_be_label(node_pod) or not _active(node_pod):
            continue
        try:
            containers = qos.container_batch(node_pod.pod)
        except (qos.QoSError, ValueError):
            continue
        total += sum(requests.get(vocab.BATCH_CPU, 0) for requests, _ in containers.values())
    return total


def _release(sample: CpuSample, *, lower: float, upper: float, usage_threshold: float) -> tuple[int, str]:
    usage, request, limit = sample.usage, sample.request, sample.limit
    if limit <= 0 or request <= 0:
        return 0, f"limit {limit}m, request {request}m: nothing to judge"
    if not evict_strategy.be_usage_high(usage, limit, usage_threshold):
        return 0, f"BE uses {usage}m of its {limit}m limit (< {usage_threshold:g}%)"
    satisfaction = limit / request
    release = evict_strategy.be_satisfaction_gap(request, limit, lower=lower, upper=upper)
    if release <= 0:
        return 0, f"satisfaction {limit}m / {request}m = {satisfaction:.2f}: above {lower:g}% or at {upper:g}%"
    return release, (
        f"BE uses {usage}m of {limit}m; satisfaction {limit}m / {request}m = {satisfaction:.2f} ≤ {lower:g}%: "
        f"release {request}m × ({upper:g}% − {satisfaction:.2f}) = {release}m"
    )


def cpu_satisfaction_release(
    window: Sequence[CpuSample],
    *,
    window_seconds: float,
    collect_interval: float,
    lower_percent: float,
    upper_percent: float,
    usage_threshold_percent: float = DEFAULT_BE_USAGE_THRESHOLD,
) -> tuple[int, str]:
    """(millicores to release, explanation); 0 when the window is too thin or BE is satisfied."""
    if len(window) * collect_interval < window_seconds / 3:
        return 0, f"{len(window)} samples do not cover a third of the {window_seconds:g} s window"
    n = len(window)
    average = CpuSample(
        at=window[-1].at,
        usage=sum(s.usage for s in window) // n,
        request=sum(s.request for s in window) // n,
        limit=sum(s.limit for s in window) // n,
    )
    options = {"lower": lower_percent, "upper": upper_percent, "usage_threshold": usage_threshold_percent}
    from_average, text = _release(average, **options)
    from_last, last_text = _release(window[-1], **options)
    if from_average <= 0 or from_last <= 0:
        return 0, text if from_average <= 0 else last_text
    last = window[-1]
    if (last.request, last.limit) == (average.request, average.limit):
        return from_average, text
    return min(from_average, from_last), f"{text}; latest sample: {last_text}"


def cpu_victims(
    pods: Sequence[NodePod], pod_cpu: Mapping[str, int], release: int, *, pending: Iterable[str] = (), reason: str
) -> list[Victim]:
    """BE pods to evict until their batch-cpu requests reach `release` millicores."""
    pending_set = set(pending)
    requests: dict[str, int] = {}
    for node_pod in pods:
        if _is_be_label(node_pod) and _active(node_pod) and allowed(node_pod, BE_CPU):
            requests[node_pod.uid] = be_request_milli([node_pod])
    released = sum(requests.get(uid, 0) for uid in pending_set)
    candidates = [p for p in pods if p.uid in requests and p.uid not in pending_set]

    def key(p: NodePod) -> tuple[float, float]:
        ratio = pod_cpu.get(p.uid, 0) / requests[p.uid] if requests[p.uid] else 0.0
        return (p.pod.spec.priority if p.pod.spec.priority is not None else 0, -ratio)

    victims: list[Victim] = []
    for node_pod in sorted(candidates, key=key):
        if released >= release:
            break
        released += requests[node_pod.uid]
        victims.append(
            Victim(
                pod=node_pod,
                feature=BE_CPU,
                released=requests[node_pod.uid],
                reason=f"{BE_CPU}: {reason}; this pod requests {requests[node_pod.uid]}m batch-cpu",
            )
        )
    return victims
