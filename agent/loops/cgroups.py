"""The be-cgroup loop (spec §5.7: BE pods' and containers' CPU shares/weight, CFS quota and memory limit), the
memory-qos loop (§5.3: every class's containers' memory.min / low / high) and the fail-safe (the besteffort CFS
quota pinned at its minimum while no NodeSLO can be read, released after)."""

from __future__ import annotations

import logging

from agent import actuate, memory_qos, qos
from agent.loops.base import Actuator, LoopResult, Round
from schemas import vocab
from schemas.qos import Problem

log = logging.getLogger(__name__)

MIN_QUOTA_US = 2000
"""The smallest besteffort CFS quota the cfsQuota suppress policy writes (spec §5.5.1), and the fail-safe's."""


def be_cgroups(act: Actuator, rnd: Round, *, quota_unlimited: bool = False) -> LoopResult:
    """`quota_unlimited`: while the fail-safe pins the besteffort quota (Failsafe.pins_quota), the BE pods' own CFS
    quotas are lifted, in the round before it pins and until the round after it releases."""
    wants, problems = actuate.be_cgroup_wants(
        rnd.pods,
        rnd.layout,
        rnd.slo,
        cpu_normalization_ratio=rnd.cpu_normalization_ratio,
        quota_unlimited=quota_unlimited,
    )
    result = LoopResult(problems=[Problem(target=p.target, reason=p.reason) for p in problems])
    act.apply_wants(wants, result, rnd)
    return result


def memory_qos_loop(act: Actuator, rnd: Round, *, node_memory: int) -> LoopResult:
    """Memory QoS (agent.memory_qos) where some class turns it on and the kernel has the files: on cgroup v1 without
    memory.min (a mainline kernel) it is one problem, not a write per container. Turned off everywhere, it writes the
    none values until every container has them again (the memory is given back), then rests."""
    enabled = memory_qos.enabled_anywhere(rnd.slo.get("resourceQOSStrategy", {}))
    if not enabled and not act.memory_qos_applied:
        return LoopResult()
    layout = rnd.layout
    probe = layout.file("memory", layout.qos_dir(vocab.KUBE_QOS_GUARANTEED), "memory.min")
    if not act.cgroups.exists(probe):
        reason = "not supported by this kernel: no memory.min / memory.low / memory.high; memory QoS not applied"
        return LoopResult(problems=[Problem(target=probe, reason=reason)])
    wants, problems = actuate.memory_qos_wants(rnd.pods, layout, rnd.slo, node_memory=node_memory)
    result = LoopResult(problems=[Problem(target=p.target, reason=p.reason) for p in problems])
    act.apply_wants(wants, result, rnd)
    # turned off everywhere after it wrote: the none values (0, 0, max) go on being written until nothing differs
    act.memory_qos_applied = enabled or bool(result.changes) or result.deferred > 0
    return result


class Failsafe:
    """Active while the control plane has been silent for longer than `after` seconds."""

    def __init__(self, *, after: float, cpus: int) -> None:
        self.after = after
        self.cpus = cpus
        self.active = False

    def pins_quota(self, silent_for: float) -> bool:
        """Whether the besteffort quota is pinned after this round or was before it: the BE pods' own quotas must be
        lifted first when it pins (the be-cgroup loop runs before this one), and stay lifted in the round that
        releases it (the pods' quotas come back the round after, under an unlimited parent)."""
        return self.active or silent_for > self.after

    def run(self, act: Actuator, rnd: Round, *, silent_for: float, node: str) -> LoopResult:
        result = LoopResult()
        silent = silent_for > self.after
        if not silent and not self.active:
            return result
        layout = rnd.layout
        name = "cpu.max" if layout.version == 2 else "cpu.cfs_quota_us"
        path = layout.file("cpu", layout.qos_dir(vocab.KUBE_QOS_BESTEFFORT), name)
        if silent:
            min_percent = rnd.slo["resourceUsedThresholdWithBE"].get("cpuSuppressMinPercent") or 0
            value = str(max(MIN_QUOTA_US, self.cpus * qos.QUOTA_PERIOD_US * int(min_percent) // 100))
            reason = (
                f"fail-safe: no NodeSLO readable for {silent_for:.0f} s (> {self.after:g} s): BE CPU pinned at its "
                "minimum, no new evictions"
            )
        else:
            value = "max" if layout.version == 2 else "-1"
            reason = "fail-safe over: the control plane is back, BE CPU quota released"
        act.apply_wants([actuate.Want(path=path, value=value, reason=reason)], result, rnd)
        if not any(p.target == path for p in result.problems):
            if silent and not self.active:
                log.warning("node %s: %s", node, reason)
            self.active = silent
        return result
