"""The cpu-suppress loop (spec §5.5.1): the besteffort cgroup's CFS quota or cpuset follows what BE pods may use now
(agent.suppress); released (quota unlimited, every CPU BE may have) when the strategy is off. Whatever the policy,
the BE cpuset never holds the reserved CPUs or an LSE pod's (agent.suppress.be_cpu_pools); while the kubelet's pod
list cannot be read, the last pools known are kept (none known yet: the cpuset is left as it is). Also
`be_real_limit`, the CPU the BE pods can get now, which the CPU satisfaction eviction reads."""

from __future__ import annotations

from agent import actuate, qos, suppress
from agent.files import PathRejected
from agent.loops.base import Actuator, LoopResult, Round
from schemas import vocab
from schemas.qos import Change, Problem


def cpu_suppress(
    act: Actuator,
    rnd: Round,
    *,
    usage_max_age: float,
    reserved_cpu_milli: int,
    reserved_cpus: frozenset[int] = frozenset(),
    psi_rule: suppress.PsiRule | None = None,
) -> LoopResult:
    """The pods' and containers' cpusets are checked when the besteffort one moves and on static passes (new pods
    start with the kubelet's full set). `psi_rule`: the opt-in PSI rule (agent.suppress.psi_step), None when off."""
    result = LoopResult()
    layout = rnd.layout
    threshold = rnd.slo["resourceUsedThresholdWithBE"]
    be_dir = layout.qos_dir(vocab.KUBE_QOS_BESTEFFORT)
    quota_path = layout.file("cpu", be_dir, "cpu.max" if layout.version == 2 else "cpu.cfs_quota_us")
    unlimited = "max" if layout.version == 2 else "-1"
    try:
        all_cpus = act.cpu_topology(rnd.static)
    except (OSError, ValueError) as e:
        result.problems.append(Problem(target=act.sys_root, reason=f"cannot read the CPUs: {e}"))
        return result
    pools = _pools(act, rnd, all_cpus, reserved_cpus, result)
    be_cpus = pools.ids if pools is not None else set()
    if not threshold.get("enable"):
        released = "CPU suppress is off: BE quota unlimited and every CPU BE may have (§5.5.1)"
        act.apply_wants([actuate.Want(path=quota_path, value=unlimited, reason=released)], result, rnd)
        if pools is not None:
            set_be_cpuset(act, rnd, be_cpus, released + pools.why_not(), result)
        return result
    tick = rnd.tick
    if tick is None or tick.node is None or rnd.now - tick.at > usage_max_age:
        result.problems.append(Problem(target="usage", reason="no fresh CPU usage sample: BE CPU left as is"))
        return result
    pressure = suppress.psi_step(
        psi_rule,
        cpu_some={p.pod.uid: p.psi.cpu_some for p in tick.pods if p.psi is not None and p.psi.cpu_some is not None},
        pods=rnd.pods,
        capacity_milli=len(all_cpus) * 1000,
    )
    allowance = suppress.be_allowance(
        capacity_milli=len(all_cpus) * 1000,
        node_used_milli=int(tick.node[1] * 1000),
        pod_used_milli={p.pod.uid: int(p.sample[1] * 1000) for p in tick.pods},
        pods=rnd.pods,
        threshold_percent=threshold.get("cpuSuppressThresholdPercent", 65),
        min_percent=threshold.get("cpuSuppressMinPercent"),
        node_reserved_milli=max(reserved_cpu_milli, 1000 * len(reserved_cpus)),
        pressure=pressure,
    )
    if threshold.get("cpuSuppressPolicy") == "cfsQuota":
        current_text = actuate.normalize(quota_path, act.cgroups.read(quota_path))
        if current_text is None:
            result.problems.append(Problem(target=quota_path, reason="cgroup file missing"))
            return result
        current = -1 if current_text in ("-1", "max") else int(current_text)
        target = suppress.cfs_quota_target(allowance.milli, current=current, cpus=len(all_cpus))
        if target is not None:
            reason = f"BE may use {allowance.explanation}: CFS quota {target} µs per 100 ms (§5.5.1)"
            act.apply_wants([actuate.Want(path=quota_path, value=str(target), reason=reason)], result, rnd)
        if pools is not None:
            reason = "cfsQuota policy: BE cpuset is every CPU BE may have" + pools.why_not()
            set_be_cpuset(act, rnd, be_cpus, reason, result)
        return result
    if pools is None:
        return result
    old = act.read_cpuset(layout.file("cpuset", be_dir, "cpuset.cpus")) or be_cpus
    size = min(suppress.cpuset_size(allowance.milli, old_size=len(old), logical_cpus=len(all_cpus)), len(be_cpus))
    chosen = set(suppress.pick_be_cpus(pools, size))
    reason = f"BE may use {allowance.explanation}: {size} CPUs (§5.5.1){pools.why_not()}"
    set_be_cpuset(act, rnd, chosen, reason, result)
    quota_reason = "cpuset policy: BE CFS quota unlimited"
    act.apply_wants([actuate.Want(path=quota_path, value=unlimited, reason=quota_reason)], result, rnd)
    return result


def _pools(
    act: Actuator, rnd: Round, all_cpus: list[suppress.Cpu], reserved: frozenset[int], result: LoopResult
) -> suppress.BeCpuPools | None:
    """The CPUs BE may have, from this round's pods (kept on the actuator for rounds whose pod list could not be
    read); None when no pod list was ever read, or when nothing is left for BE (a problem then)."""
    if rnd.pods_known:
        act.be_cpu_pools = suppress.be_cpu_pools(all_cpus, rnd.pods, reserved=reserved)
    pools = act.be_cpu_pools
    if pools is None:
        result.problems.append(Problem(target="pods", reason="no pod list read yet: the BE cpuset is left as it is"))
        return None
    if not pools.ids:
        result.problems.append(
            Problem(target="cpuset", reason=f"no CPU left for BE pods{pools.why_not()}: the BE cpuset is left as it is")
        )
        return None
    return pools


def set_be_cpuset(act: Actuator, rnd: Round, cpus: set[int], reason: str, result: LoopResult) -> None:
    """Every cpuset cgroup under besteffort gets `cpus`, in an order that never leaves a child with a CPU its parent
    lacks: first each directory missing one of `cpus` is widened to what it has plus `cpus`, parents first; once none
    misses any, each holding more than `cpus` is narrowed to it, children first. Every single write keeps that rule,
    so the round's write bound may stop the work anywhere and a later round goes on from what it reads
    (`act.be_cpuset_settled` is False until then). Once settled, outside static passes nothing below besteffort is
    read while besteffort itself holds `cpus`."""
    top = rnd.layout.file("cpuset", rnd.layout.qos_dir(vocab.KUBE_QOS_BESTEFFORT), "").rstrip("/")
    if not rnd.static and act.be_cpuset_settled and act.read_cpuset(f"{top}/cpuset.cpus") in (cpus, None):
        return
    dirs = act.subdirs(top, depth=2)
    current = {d: act.read_cpuset(f"{d}/cpuset.cpus") for d in dirs}
    settled = _move_cpusets(act, rnd, dirs, current, cpus, reason, result, widen=True) and _move_cpusets(
        act, rnd, dirs[::-1], current, cpus, reason, result, widen=False
    )
    if not settled:
        result.deferred += sum(1 for have in current.values() if have is not None and have != cpus)
    act.be_cpuset_settled = settled


def _move_cpusets(
    act: Actuator,
    rnd: Round,
    dirs: list[str],
    current: dict[str, set[int] | None],
    cpus: set[int],
    reason: str,
    result: LoopResult,
    *,
    widen: bool,
) -> bool:
    """One pass of set_be_cpuset over `dirs` in the given order; `current` follows the writes. False when the round's
    bound or a refused write stopped it (a child cannot be given what its parent could not)."""
    for d in dirs:
        have = current[d]
        if have is None or (cpus <= have if widen else have == cpus):
            continue
        if rnd.budget <= 0:
            return False
        after = have | cpus if widen else cpus
        path = f"{d}/cpuset.cpus"
        if not act.write(act.cgroups, path, suppress.format_cpuset(after), result):
            return False
        why = f"{reason}; widened first so no child holds a CPU its parent lacks" if after != cpus else reason
        result.changes.append(
            Change(path=path, before=suppress.format_cpuset(have), after=suppress.format_cpuset(after), reason=why)
        )
        current[d] = after
        rnd.budget -= 1
    return True


def be_real_limit(act: Actuator, layout: actuate.Layout) -> int | None:
    """What BE pods can get now, millicores: min(CPUs in the besteffort cpuset × 1000, its CFS quota)."""
    be_dir = layout.qos_dir(vocab.KUBE_QOS_BESTEFFORT)
    cpus = act.read_cpuset(layout.file("cpuset", be_dir, "cpuset.cpus"))
    if cpus is None:
        try:
            cpus = {c.id for c in act.cpu_topology(False)}
        except (OSError, ValueError):
            return None
    limit = len(cpus) * 1000
    quota_path = layout.file("cpu", be_dir, "cpu.max" if layout.version == 2 else "cpu.cfs_quota_us")
    try:
        quota = actuate.normalize(quota_path, act.cgroups.read(quota_path))
    except (OSError, PathRejected):
        quota = None
    if quota is not None and quota not in ("-1", "max"):
        limit = min(limit, int(quota) * 1000 // qos.QUOTA_PERIOD_US)
    return limit
