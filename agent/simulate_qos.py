"""A simulated node's cpu-suppress, be-cgroup, memory-evict and cpu-evict loops in dry-run (the agent's planning, on
synthetic cgroups): pure.

`koordbus up --simulate-nodes` (koordbus.simulation) asks `SuppressPlanner.plan` once per published window with the
window's last second (the node's and its pods' CPU, agent.simulate) and the node's NodeSLO as the agent merges it
(agent.slo.effective_slo). With resourceUsedThresholdWithBE enabled and the cfsQuota policy it computes what the real
loop computes — Koordinator's suppress formula (agent.suppress.be_allowance) and the besteffort CFS quota
(agent.suppress.cfs_quota_target) — against the synthetic besteffort cgroup of a cgroup v1 cgroupfs node, whose
quota stays unlimited (-1) because nothing is written in dry-run. Like the real loop, it returns an
ActuationApplied (dry_run=true) only when what it would write differs from its last event by at least 1 % of the
node's quota (the loop's own small-move rule), so a steady node does not repeat itself. The cpuset policy is not
simulated (no event).

`BeCgroupPlanner.plan` is the be-cgroup loop (agent.loops.cgroups): what every BE pod's cgroup should hold from its
batch resources (agent.actuate.be_cgroup_wants: cpu.shares, CFS quota, memory limit), against the values the kubelet
gives a besteffort pod's cgroup (which stay, nothing being written); an event names the values not planned in its
previous event, so each new batch pod shows once.

`EvictPlanner.plan` is the memory-evict and cpu-evict loops (agent.loops.evict) over the window: BEMemoryEvict and
MemoryEvict on the last second's node and pod memory against the node's total (agent.evict.memory_victims), CPUEvict
on the node's CPU averaged over cpuEvictTimeWindowSeconds of the window's samples (agent.evict.node_cpu_victims), as
the features the simulated agent runs (`FEATURES`) and the NodeSLO allow. What a real agent in dry-run publishes for
its victims is what it returns: one ActuationApplied (dry_run=true) per loop, each victim a Change "eviction would be
requested" with the feature's reason, and no PodEvictionRequested (in dry-run the agent asks the bridge for nothing,
so the pod stays). Where the real loop's cool-downs and its publish-what-differs rule keep it from repeating itself,
the planner says a loop's victims again only when they change. Under the simulated cluster's thresholds
(koordbus.simulation.SIMULATED_THRESHOLDS) a hot node near its daily peak crosses CPUEvict's 75 % and its
eviction-enabled online pods (agent.simulate.EVICTABLE_APPS) are picked; node memory stays near 40–65 % (batch memory
is placed within a batch allocatable of 65 % less prod use), under the 70 % of memory eviction, so memory-evict is
planned only where a NodeSLO sets a lower threshold.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Any, Final

from agent import actuate, evict, suppress
from agent.actuate import NodePod
from agent.core import Tick
from schemas.qos import ActuationApplied, ActuationLoop, Change

QUOTA_PATH: Final = "cpu/kubepods/besteffort/cpu.cfs_quota_us"
"""The besteffort cgroup's CFS quota on a cgroup v1 cgroupfs node, relative to the cgroup root."""
UNLIMITED: Final = "-1"


class SuppressPlanner:
    """One simulated node's cpu-suppress loop: remembers the quota of its last event."""

    def __init__(self, node: str, *, cpu_cores: float) -> None:
        self.node = node
        self.cpus = max(round(cpu_cores), 1)
        self.last_target: int | None = None

    def plan(
        self, tick: Tick, pods: Sequence[NodePod], *, slo: Mapping[str, Any], slo_revision: int
    ) -> ActuationApplied | None:
        """The loop's event for this second, or None (suppress off, the cpuset policy, or nothing new to say)."""
        threshold = slo.get("resourceUsedThresholdWithBE", {})
        if not threshold.get("enable") or threshold.get("cpuSuppressPolicy") != "cfsQuota" or tick.node is None:
            return None
        capacity = self.cpus * 1000
        allowance = suppress.be_allowance(
            capacity_milli=capacity,
            node_used_milli=int(tick.node[1] * 1000),
            pod_used_milli={p.pod.uid: int(p.sample[1] * 1000) for p in tick.pods},
            pods=pods,
            threshold_percent=threshold.get("cpuSuppressThresholdPercent", 65),
            min_percent=threshold.get("cpuSuppressMinPercent"),
        )
        target = suppress.cfs_quota_target(allowance.milli, current=-1, cpus=self.cpus)
        if target is None:
            return None
        node_quota = self.cpus * suppress.QUOTA_PERIOD_US
        if self.last_target is not None and abs(target - self.last_target) < node_quota // 100:
            return None
        self.last_target = target
        reason = f"BE may use {allowance.explanation}: CFS quota {target} µs per 100 ms (§5.5.1)"
        return ActuationApplied(
            node=self.node,
            loop="cpu-suppress",
            at=tick.at,
            dry_run=True,
            changes=[Change(path=QUOTA_PATH, before=UNLIMITED, after=str(target), reason=reason)],
            slo_revision=slo_revision,
        )


LAYOUT: Final = actuate.Layout(version=1, driver="cgroupfs")
KUBELET_BE_POD: Final = {"cpu.shares": "2", "cpu.cfs_quota_us": "-1", "memory.limit_in_bytes": "9223372036854771712"}
"""What the kubelet writes to a besteffort pod's cgroup v1 files."""
MAX_CHANGES: Final = 30
"""Changes named in one event; the rest are counted as deferred (the real loop bounds its writes per round)."""


class BeCgroupPlanner:
    """One simulated node's be-cgroup loop: remembers the values its last event planned."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.planned: frozenset[tuple[str, str]] = frozenset()

    def plan(
        self, at: float, pods: Sequence[NodePod], *, slo: Mapping[str, Any], slo_revision: int
    ) -> ActuationApplied | None:
        """The loop's event for the pods listed at `at`, or None (no BE pod with a value not planned before)."""
        wants, _ = actuate.be_cgroup_wants(pods, LAYOUT, slo)
        wants = [w for w in wants if KUBELET_BE_POD.get(_name(w.path)) != w.value]  # a file already so: no change
        new = [w for w in wants if (w.path, w.value) not in self.planned]
        self.planned = frozenset((w.path, w.value) for w in wants)
        if not new:
            return None
        changes = [
            Change(
                path=w.path, before=KUBELET_BE_POD.get(w.path.rsplit("/", 1)[-1], ""), after=w.value, reason=w.reason
            )
            for w in new
        ]
        return ActuationApplied(
            node=self.node,
            loop="be-cgroup",
            at=at,
            dry_run=True,
            changes=changes[:MAX_CHANGES],
            deferred=max(len(changes) - MAX_CHANGES, 0),
            slo_revision=slo_revision,
        )


def _name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


FEATURES: Final = frozenset({evict.BE_MEMORY, evict.MEMORY, evict.CPU})
"""The eviction features a simulated node's agent runs (its --evict setting). The allocatable ones are left out: a
simulated node's placement already evicts, for real, the batch pods past a shrunk batch allocatable
(agent.simulate.place_batch_pods); BECPUEvict judges the BE group's real limit, which in dry-run stays the whole
node (nothing suppresses it), so it would never find BE unsatisfied."""


class EvictPlanner:
    """One simulated node's memory-evict and cpu-evict loops in dry-run (agent.loops.evict's planning, with no pod
    pending since nothing is asked for): remembers the victims of each loop's last event and CPUEvict's window."""

    def __init__(self, node: str, *, cpu_cores: float, memory_bytes: int, features: frozenset[str] = FEATURES) -> None:
        self.node = node
        self.capacity_milli = max(round(cpu_cores), 1) * 1000
        """The node's CPUs × 1000, as the agent counts them (agent.loops.evict reads the CPU topology)."""
        self.memory_bytes = memory_bytes
        self.features = features
        self.node_cpu: collections.deque[tuple[float, int]] = collections.deque()
        """(time, node CPU millicores) over CPUEvict's window, as the loop keeps it."""
        self.last: dict[ActuationLoop, frozenset[str]] = {}

    def plan(
        self,
        tick: Tick,
        pods: Sequence[NodePod],
        *,
        node_cpu: Sequence[tuple[float, int]],
        slo: Mapping[str, Any],
        slo_revision: int,
    ) -> list[ActuationApplied]:
        """The loops' events for the window ending with `tick` (`node_cpu`: the window's node CPU samples): one per
        loop whose victims differ from its last event's, each victim a Change "eviction would be requested"."""
        threshold = slo.get("resourceUsedThresholdWithBE", {})
        if not self.features or not threshold.get("enable") or tick.node is None:
            self.node_cpu.clear()
            return []
        window_seconds = max(float(threshold.get("cpuEvictTimeWindowSeconds") or 1), 1.0)
        self.node_cpu.extend(node_cpu)
        while self.node_cpu and self.node_cpu[0][0] <= tick.at - window_seconds:
            self.node_cpu.popleft()
        victims: dict[ActuationLoop, list[evict.Victim]] = {
            "memory-evict": self._memory(tick, pods, threshold),
            "cpu-evict": self._cpu(tick, pods, threshold),
        }
        events: list[ActuationApplied] = []
        for loop, found in victims.items():
            uids = frozenset(v.pod.uid for v in found)
            if uids == self.last.get(loop, frozenset()):
                continue
            self.last[loop] = uids
            if not found:
                continue
            requests = [
                evict.eviction_request(node=self.node, at=tick.at, pod=v.pod, feature=v.feature, reason=v.reason)
                for v in found
            ]
            events.append(
                ActuationApplied(
                    node=self.node,
                    loop=loop,
                    at=tick.at,
                    dry_run=True,
                    changes=[evict.eviction_change(r, evict.WOULD_REQUEST) for r in requests],
                    slo_revision=slo_revision,
                )
            )
        return events

    def _memory(self, tick: Tick, pods: Sequence[NodePod], threshold: Mapping[str, Any]) -> list[evict.Victim]:
        """BEMemoryEvict and MemoryEvict over the last second (agent.loops.evict's `_memory`)."""
        if not self.features & {evict.BE_MEMORY, evict.MEMORY}:
            return []
        assert tick.node is not None
        victims, _ = evict.memory_victims(
            features=self.features,
            capacity=self.memory_bytes,
            node_used=tick.node[2],
            pod_memory={p.pod.uid: p.sample[2] for p in tick.pods},
            pods=pods,
            threshold_percent=int(threshold.get("memoryEvictThresholdPercent", 70)),
            lower_percent=threshold.get("memoryEvictLowerPercent"),
            priority_threshold=threshold.get("evictEnabledPriorityThreshold"),
        )
        return victims

    def _cpu(self, tick: Tick, pods: Sequence[NodePod], threshold: Mapping[str, Any]) -> list[evict.Victim]:
        """CPUEvict over the node's CPU in the window (agent.loops.evict's `_node_cpu`): needs
        cpuEvictThresholdPercent and evictEnabledPriorityThreshold."""
        percent = threshold.get("cpuEvictThresholdPercent")
        priority_threshold = threshold.get("evictEnabledPriorityThreshold")
        if evict.CPU not in self.features or percent is None or priority_threshold is None:
            return []
        victims, _ = evict.node_cpu_victims(
            capacity_milli=self.capacity_milli,
            window=list(self.node_cpu),
            pod_cpu={p.pod.uid: int(p.sample[1] * 1000) for p in tick.pods},
            pods=pods,
            threshold_percent=int(percent),
            lower_percent=threshold.get("cpuEvictLowerPercent"),
            priority_threshold=int(priority_threshold),
        )
        return victims
