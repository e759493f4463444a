"""The memory-evict and cpu-evict loops (spec §5.5.2–5.5.3): which pods to evict now (agent.evict), with the
cool-downs and the pods already asked for; `request` publishes each victim's PodEvictionRequested (the bridge calls
the Eviction API; `eviction_message` is its wire form, simulated nodes' evictions included) or, when the bus is away
and local kills are on, kills the pod's containers on the node."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import msgspec

from agent import actuate, collect, evict
from agent.core import Tick
from agent.loops.base import Actuator, LoopResult, Round
from agent.loops.suppression import be_real_limit
from agent.settings import QosSettings
from bus import api, subjects
from schemas import vocab
from schemas.qos import ActuationApplied, ActuationLoop, Change, PodEvictionRequested, Problem

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
        self._be_request: int | None = None

    def run(self, act: Actuator, rnd: Round) -> list[tuple[ActuationLoop, LoopResult]]:
        features = self.settings.evict_feature_set
        threshold = rnd.slo["resourceUsedThresholdWithBE"]
        present = {p.uid for p in rnd.pods}
        horizon = rnd.now - self.settings.eviction_pending_seconds
        self.pending = {uid: at for uid, at in self.pending.items() if uid in present and at > horizon}
        tick = rnd.tick
        if not features or not threshold.get("enable"):
            self._cpu_window.clear()
            return []
        if tick is None or tick.node is None or rnd.now - tick.at > self.settings.usage_max_age:
            return []
        out: list[tuple[ActuationLoop, LoopResult]] = []
        if features & {evict.BE_MEMORY, evict.MEMORY}:
            out.append(("memory-evict", self._memory(rnd, threshold, features, tick)))
        if evict.BE_CPU in features:
            out.append(("cpu-evict", self._cpu(act, rnd, threshold, tick)))
        return out

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

    def _cpu(self, act: Actuator, rnd: Round, threshold: dict[str, Any], tick: Tick) -> LoopResult:
        result = LoopResult()
        lower = threshold.get("cpuEvictBESatisfactionLowerPercent")
        upper = threshold.get("cpuEvictBESatisfactionUpperPercent")
        if lower is None or upper is None:
            return result  # BECPUEvict needs both (§5.5)
        if threshold.get("cpuEvictPolicy", "evictByRealLimit") != "evictByRealLimit":
            reason = "only evictByRealLimit is supported by the agent"
            result.problems.append(Problem(target="cpuEvictPolicy", reason=reason))
            return result
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
            if result.victims:
                self._cooldown_until["cpu-evict"] = rnd.now + CPU_EVICT_COOLDOWN_SECONDS
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
                outcome = "eviction would be requested"
            else:
                try:
                    await publish(*eviction_message(request))
                    outcome = "eviction requested"
                    act.stats.evictions_requested += 1
                except Exception as e:
                    if not self.settings.evict_locally:
                        result.problems.append(Problem(target=target, reason=f"eviction request not sent: {e}"))
                        continue
                    killed = await asyncio.to_thread(kill_locally, act, layout, victim.pod)
                    outcome = f"killed locally ({killed} processes; the bus is away: {e})"
                    act.stats.evictions_killed_locally += 1
                self.pending[meta.uid] = now
            result.changes.append(eviction_change(request, outcome))


FEATURE_LOOPS: Final[dict[str, ActuationLoop]] = {
    evict.BE_MEMORY: "memory-evict",
    evict.MEMORY: "memory-evict",
    evict.MEMORY_ALLOCATABLE: "memory-evict",
    evict.BE_CPU: "cpu-evict",
    evict.CPU_ALLOCATABLE: "cpu-evict",
}
"""The loop each eviction feature belongs to (spec §5.5.2 memory, §5.5.3 CPU)."""


def eviction_change(request: PodEvictionRequested, outcome: str) -> Change:
    """The Change an eviction loop's ActuationApplied reports for a pod it asked to evict, with what happened."""
    return Change(
        path=f"pods/{request.namespace}/{request.name}", before="running", after=outcome, reason=request.reason
    )


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
            changes=[eviction_change(r, "eviction requested") for r in group],
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
