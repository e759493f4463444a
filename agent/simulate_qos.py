"""A simulated node's cpu-suppress and be-cgroup loops in dry-run (the agent's planning, on synthetic cgroups): pure.

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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from agent import actuate, suppress
from agent.actuate import NodePod
from agent.core import Tick
from schemas.qos import ActuationApplied, Change

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
