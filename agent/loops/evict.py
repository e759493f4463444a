"""The memory-evict and cpu-evict loops (spec §5.5.2–5.5.3; cpu-evict runs BECPUEvict, then CPUEvict, the node's
CPU averaged over cpuEvictTimeWindowSeconds): which pods to evict now (agent.evict), with the
cool-downs and the pods already asked for; `request` publishes each victim's PodEvictionRequested (the bridge calls
the Eviction API; `eviction_message` is its wire form, simulated nodes' evictions included) or, when the bus is away
and local kills are on, kills the pod's containers on the node."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import msgspec

from agent import actuate, collect, evict, evict_round, evict_strategy
from agent.core import Tick
from agent.loops.base import Actuator, LoopResult, Round
from agent.loops.suppress import be_real_limit
from agent.settings import QosSettings
from bus import api, subjects
from schemas import vocab
from schemas.qos import ActuationApplied, ActuationLoop, PodEvictionRequested, Problem

log = logging.getLogger(__name__)

MEMORY_EVICT_COOLDOWN_SECONDS = 4.0
CPU_EVICT_COOLDOWN_SECONDS = 20.0
"""After a round that evicted, the loop waits this long (koordlet's cool-downs)."""

Publish = Callable[[str, bytes, str], Awaitable[object]]


class Evictions:
    def __init__(self, settings: QosSettings, *, proc_root: str, collect_interval: float) -> None:
        self.settings = settings
        self._proc_root = proc_root
        self._collect_interval = collect_interval
        self.pending: dict[str, float] = {}
        """uid → when its eviction was requested: counted as released, not asked for again, for a while."""
        self._cooldown_until: dict[str, float] = {}
        self._cpu_window: collections.deque[evict.CpuSample] = collections.deque()
        self._node_cpu_window: collections.deque[tuple[float, int]] = collections.deque()
        """(time, node CPU millicores) over CPUEvict's window."""
        self._be_request: int | None = None

    def run(
        self, act: Actuator, rnd: Round, *, allocatable: Mapping[str, int] | None = None
    ) -> list[tuple[ActuationLoop, LoopResult]]:
        """`allocatable`: the node's batch/mid allocatable (agent.allocatable_watch), for the allocatable features;
        None while unknown (they wait)."""
        features = self.settings.evict_feature_set
        threshold = rnd.slo["resourceUsedThresholdWithBE"]
        present = {p.uid for p in rnd.pods}
        horizon = rnd.now - self.settings.eviction_pending_seconds
        self.pending = {uid: at for uid, at in self.pending.items() if uid in present and at > horizon}
        tick = rnd.tick
        if not features or not threshold.get("enable"):
            self._cpu_window.clear()
            self._node_cpu_window.clear()
            return []
        if tick is None or tick.node is None or rnd.now - tick.at > self.settings.usage_max_age:
            return []
        out: list[tuple[ActuationLoop, LoopResult]] = []
        if features & {evict.BE_MEMORY, evict.MEMORY, evict.MEMORY_ALLOCATABLE}:
            result = (
                self._memory(rnd, threshold, features, tick) if features & {evict.BE_MEMORY, evict.MEMORY} else None
            )
            result = self._allocatable(
                rnd, threshold, features, tick, allocatable, result or LoopResult(), feature=evict.MEMORY_ALLOCATABLE
            )
            out.append(("memory-evict", result))
        if features & {evict.BE_CPU, evict.CPU, evict.CPU_ALLOCATABLE}:
            result = self._cpu(act, rnd, threshold, features, tick, allocatable)
            out.append(
                (
                    "cpu-evict",
                    self._allocatable(
                        rnd, threshold, features, tick, allocatable, result, feature=evict.CPU_ALLOCATABLE
                    ),
                )
            )
        return out

    def _allocatable(
        self,
        rnd: Round,
        threshold: dict[str, Any],
        features: frozenset[str],
        tick: Tick,
        allocatable: Mapping[str, int] | None,
        result: LoopResult,
        *,
        feature: str,
    ) -> LoopResult:
        """MemoryAllocatableEvict / CPUAllocatableEvict after the usage features of the same loop (never a pod twice),
        within the loop's cool-down; each needs its threshold and lower percents and allocatableEvictPriorityThreshold
        (Koordinator's check, agent.evict_strategy) and the node's allocatable."""
        if feature not in features:
            return result
        loop = "memory-evict" if feature == evict.MEMORY_ALLOCATABLE else "cpu-evict"
        if result.victims or rnd.now < self._cooldown_until.get(loop, 0.0):
            return result
        prefix = "memory" if feature == evict.MEMORY_ALLOCATABLE else "cpu"
        try:
            strategy = msgspec.convert(threshold, evict_strategy.ThresholdStrategy)
        except msgspec.ValidationError as e:
            result.problems.append(Problem(target="resourceUsedThresholdWithBE", reason=f"{feature}: {e}"))
            return result
        check = evict_strategy.check_memory_allocatable if prefix == "memory" else evict_strategy.check_cpu_allocatable
        if check(strategy) is not None:
            return result  # not configured (koordlet skips the feature the same way)
        if allocatable is None:
            result.problems.append(
                Problem(target="allocatable", reason=f"{feature}: the node's batch allocatable is not known yet")
            )
            return result
        index = 2 if prefix == "memory" else 1
        victims, _ = allocatable_victims(
            feature=feature,
            resource=prefix,
            pods=rnd.pods,
            pod_usage={p.pod.uid: int(p.sample[index] * (1 if prefix == "memory" else 1000)) for p in tick.pods},
            allocatable=allocatable,
            threshold_percent=_required(
                strategy.memory_allocatable_evict_threshold_percent
                if prefix == "memory"
                else strategy.cpu_allocatable_evict_threshold_percent
            ),
            lower_percent=_required(
                strategy.memory_allocatable_evict_lower_percent
                if prefix == "memory"
                else strategy.cpu_allocatable_evict_lower_percent
            ),
            priority_threshold=_required(strategy.allocatable_evict_priority_threshold),
            taken=self.pending,
        )
        if victims:
            result.victims.extend(victims)
            self._cooldown_until[loop] = rnd.now + (
                MEMORY_EVICT_COOLDOWN_SECONDS if prefix == "memory" else CPU_EVICT_COOLDOWN_SECONDS
            )
        return result

    def _memory(self, rnd: Round, threshold: dict[str, Any], features: frozenset[str], tick: Tick) -> LoopResult:
        result = LoopResult()
        if rnd.now < self._cooldown_until.get("memory-evict", 0.0):
            return result
        try:
            capacity = collect.read_meminfo(self._proc_root).total_kb * 1024
        except (OSError, KeyError, ValueError) as e:
            result.problems.append(Problem(target="meminfo", reason=f"cannot read the memory total: {e}"))
            return result
        assert tick.node is not None
        result.victims, _ = evict.memory_victims(
            features=features,
            capacity=capacity,
            node_used=tick.node[2],
            pod_memory={p.pod.uid: p.sample[2] for p in tick.pods},
            pods=rnd.pods,
            threshold_percent=int(threshold.get("memoryEvictThresholdPercent", 70)),
            lower_percent=threshold.get("memoryEvictLowerPercent"),
            priority_threshold=threshold.get("evictEnabledPriorityThreshold"),
            pending=self.pending,
        )
        if result.victims:
            self._cooldown_until["memory-evict"] = rnd.now + MEMORY_EVICT_COOLDOWN_SECONDS
        return result

    def _cpu(
        self,
        act: Actuator,
        rnd: Round,
        threshold: dict[str, Any],
        features: frozenset[str],
        tick: Tick,
        allocatable: Mapping[str, int] | None,
    ) -> LoopResult:
        """BECPUEvict, then CPUEvict (never the same pod twice), sharing the 20 s cool-down."""
        window_seconds = max(float(threshold.get("cpuEvictTimeWindowSeconds") or 1), 1.0)
        assert tick.node is not None
        self._node_cpu_window.append((tick.at, int(tick.node[1] * 1000)))
        while self._node_cpu_window and self._node_cpu_window[0][0] <= tick.at - window_seconds:
            self._node_cpu_window.popleft()
        result = self._be_cpu(act, rnd, threshold, tick, allocatable) if evict.BE_CPU in features else LoopResult()
        if evict.CPU in features and rnd.now >= self._cooldown_until.get("cpu-evict", 0.0):
            self._node_cpu(act, rnd, threshold, tick, result)
        if result.victims:
            self._cooldown_until["cpu-evict"] = rnd.now + CPU_EVICT_COOLDOWN_SECONDS
        return result

    def _node_cpu(self, act: Actuator, rnd: Round, threshold: dict[str, Any], tick: Tick, result: LoopResult) -> None:
        """CPUEvict (§5.5.3): needs cpuEvictThresholdPercent and evictEnabledPriorityThreshold."""
        percent = threshold.get("cpuEvictThresholdPercent")
        priority_threshold = threshold.get("evictEnabledPriorityThreshold")
        if percent is None or priority_threshold is None:
            return  # as koordlet: CPUEvict needs both
        try:
            capacity = len(act.cpu_topology(False)) * 1000
        except (OSError, ValueError) as e:
            result.problems.append(Problem(target=act.sys_root, reason=f"cannot read the CPUs: {e}"))
            return
        victims, _ = evict.node_cpu_victims(
            capacity_milli=capacity,
            window=list(self._node_cpu_window),
            pod_cpu={p.pod.uid: int(p.sample[1] * 1000) for p in tick.pods},
            pods=rnd.pods,
            threshold_percent=int(percent),
            lower_percent=threshold.get("cpuEvictLowerPercent"),
            priority_threshold=int(priority_threshold),
            taken=[*self.pending, *(v.pod.uid for v in result.victims)],
        )
        result.victims.extend(victims)

    def _be_cpu(
        self, act: Actuator, rnd: Round, threshold: dict[str, Any], tick: Tick, allocatable: Mapping[str, int] | None
    ) -> LoopResult:
        result = LoopResult()
        lower = threshold.get("cpuEvictBESatisfactionLowerPercent")
        upper = threshold.get("cpuEvictBESatisfactionUpperPercent")
        if lower is None or upper is None:
            return result  # BECPUEvict needs both (§5.5)
        limit: int | None
        if threshold.get("cpuEvictPolicy", "evictByRealLimit") == "evictByAllocatable":
            if allocatable is None:
                reason = "evictByAllocatable: the node's batch allocatable is not known yet"
                result.problems.append(Problem(target="allocatable", reason=reason))
                return result
            limit = int(evict_strategy.be_allocatable_limit(allocatable))
        else:
            limit = be_real_limit(act, rnd.layout)
            if limit is None:
                result.problems.append(Problem(target="besteffort", reason="cannot read the BE cpuset or CFS quota"))
                return result
        be_usage = sum(int(p.sample[1] * 1000) for p in tick.pods if p.pod.kube_qos == vocab.KUBE_QOS_BESTEFFORT)
        if rnd.static or self._be_request is None:
            self._be_request = evict.be_request_milli(rnd.pods)  # changes only with the pods: a static pass follows
        self._cpu_window.append(evict.CpuSample(at=tick.at, usage=be_usage, request=self._be_request, limit=limit))
        window_seconds = max(float(threshold.get("cpuEvictTimeWindowSeconds") or 1), 1.0)
        while self._cpu_window and self._cpu_window[0].at <= tick.at - window_seconds:
            self._cpu_window.popleft()
        if rnd.now < self._cooldown_until.get("cpu-evict", 0.0):
            return result
        release, explanation = evict.cpu_satisfaction_release(
            list(self._cpu_window),
            window_seconds=window_seconds,
            collect_interval=self._collect_interval,
            lower_percent=lower,
            upper_percent=upper,
            usage_threshold_percent=threshold.get("cpuEvictBEUsageThresholdPercent")
            or evict.DEFAULT_BE_USAGE_THRESHOLD,
        )
        if release > 0:
            pod_cpu = {p.pod.uid: int(p.sample[1] * 1000) for p in tick.pods}
            result.victims = evict.cpu_victims(rnd.pods, pod_cpu, release, pending=self.pending, reason=explanation)
        return result

    async def request(
        self, result: LoopResult, *, node: str, now: float, act: Actuator, layout: actuate.Layout, publish: Publish
    ) -> None:
        """Publish each victim's PodEvictionRequested (nothing in dry-run); if the bus is away and local kills are
        on, kill its containers here. Every victim becomes a Change saying what happened."""
        for victim in result.victims:
            meta = victim.pod.pod.metadata
            target = f"pods/{meta.namespace}/{meta.name}"
            request = evict.eviction_request(
                node=node, at=now, pod=victim.pod, feature=victim.feature, reason=victim.reason
            )
            if act.dry_run:
                outcome = evict.WOULD_REQUEST
            else:
                try:
                    await publish(*eviction_message(request))
                    outcome = evict.REQUESTED
                    act.stats.evictions_requested += 1
                except Exception as e:
                    if not self.settings.evict_locally:
                        result.problems.append(Problem(target=target, reason=f"eviction request not sent: {e}"))
                        continue
                    killed = await asyncio.to_thread(kill_locally, act, layout, victim.pod)
                    outcome = f"killed locally ({killed} processes; the bus is away: {e})"
                    act.stats.evictions_killed_locally += 1
                self.pending[meta.uid] = now
            result.changes.append(evict.eviction_change(request, outcome))


# --- the allocatable evictions (§5.5.2 MemoryAllocatableEvict, §5.5.3 CPUAllocatableEvict)


def allocatable_victims(
    *,
    feature: str,
    resource: str,
    pods: Sequence[actuate.NodePod],
    pod_usage: Mapping[str, int],
    allocatable: Mapping[str, int],
    threshold_percent: int,
    lower_percent: int,
    priority_threshold: int,
    taken: Iterable[str] = (),
) -> tuple[list[evict.Victim], str]:
    """Koordinator's allocatable eviction of `resource` ("memory" or "cpu"): the batch/mid (or native) requests of
    the pods at or under the priority threshold against the node's allocatable of each (agent.evict_round's formula,
    the one `koordbus calc memory-evict` / `cpu-evict` run); over the threshold, eviction-enabled pods in the priority
    order (largest request last-key) until their requests cover the release. `taken`: uids already asked for."""
    skip = set(taken)
    candidates = [p for p in pods if p.uid not in skip]
    eps = [evict_round.evict_pod(p.pod, pod_usage.get(p.uid)) for p in candidates]
    alloc = evict_round.allocatable_release(
        eps,
        allocatable,
        resource=resource,
        threshold=threshold_percent,
        lower=lower_percent,
        priority_threshold=priority_threshold,
    )
    explanation = "; ".join(f"{name}: {step}" for name, step in sorted(alloc.steps.items())) or "nothing requested"
    if not any(amount > 0 for amount in alloc.release.values()):
        return [], explanation
    order = evict_round.priority_order(
        eps,
        feature,
        priority_threshold=priority_threshold,
        last_key=lambda p: evict_round.pod_request(p, resource)[1],
    )
    task = evict_round.Task(
        ledger=evict_round.LEDGER_REQUESTED,
        release=alloc.release,
        candidates=order,
        amounts=alloc.pod_release.__getitem__,
    )
    victims: list[evict.Victim] = []
    for i in evict_round.pick_victims([task], [p.key for p in eps]):
        released = sum((alloc.pod_release[i] or {}).values())
        reason = f"{feature}: {explanation}; this pod requests {released}"
        victims.append(evict.Victim(pod=candidates[i], feature=feature, released=released, reason=reason))
    return victims, explanation


def _required(value: int | None) -> int:
    assert value is not None  # the feature's config check passed
    return value


FEATURE_LOOPS: Final[dict[str, ActuationLoop]] = {
    evict.BE_MEMORY: "memory-evict",
    evict.MEMORY: "memory-evict",
    evict.MEMORY_ALLOCATABLE: "memory-evict",
    evict.BE_CPU: "cpu-evict",
    evict.CPU: "cpu-evict",
    evict.CPU_ALLOCATABLE: "cpu-evict",
}
"""The loop each eviction feature belongs to (spec §5.5.2 memory, §5.5.3 CPU)."""


def requested_actuations(requests: Sequence[PodEvictionRequested]) -> list[ActuationApplied]:
    """What an agent's round reports of `requests` once published, one ActuationApplied per eviction loop (what the
    dashboard's node page lists): for simulated nodes (koordbus.simulation), whose requests are all published."""
    by_loop: dict[ActuationLoop, list[PodEvictionRequested]] = {}
    for request in requests:
        by_loop.setdefault(FEATURE_LOOPS[request.feature], []).append(request)
    return [
        ActuationApplied(
            node=group[0].node,
            loop=loop,
            at=group[0].at,
            dry_run=False,
            changes=[evict.eviction_change(r, evict.REQUESTED) for r in group],
        )
        for loop, group in by_loop.items()
    ]


def eviction_message(request: PodEvictionRequested) -> tuple[str, bytes, str]:
    """(subject, payload, message id) a PodEvictionRequested is published as, by the agent (`Evictions.request`) and
    by simulated nodes (koordbus.simulation): one request per pod and moment, so a repeat is deduplicated."""
    return (
        subjects.node_eviction(request.node),
        msgspec.json.encode(request),
        api.msg_id(request.node, "eviction", request.uid, request.at),
    )


def kill_locally(act: Actuator, layout: actuate.Layout, node_pod: actuate.NodePod) -> int:
    """SIGKILL every process of the pod's containers (read from their cgroup.procs); returns how many."""
    killed = 0
    pod_dir = layout.pod_dir(node_pod.pod.status.qos_class or vocab.KUBE_QOS_BESTEFFORT, node_pod.uid)
    for runtime, container_id in node_pod.containers.values():
        procs = layout.file("cpu", layout.container_dir(pod_dir, runtime, container_id), "cgroup.procs")
        for pid in (act.cgroups.read(procs) or "").split():
            try:
                os.kill(int(pid), signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, ValueError):
                pass
    return killed
