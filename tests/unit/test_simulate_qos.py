"""A simulated node's QoS loops in dry-run (agent.simulate_qos): the agent's own suppress formula and BE cgroup
values on synthetic cgroups, an event only when there is something new to say."""

from __future__ import annotations

from agent.simulate import SimulatedNode
from agent.simulate_qos import BeCgroupPlanner, SuppressPlanner
from agent.slo import effective_slo

T0 = 1_795_776_000.0
ON = effective_slo(
    {
        "resourceUsedThresholdWithBE": {
            "enable": True,
            "cpuSuppressThresholdPercent": 65,
            "cpuSuppressPolicy": "cfsQuota",
        }
    }
)


def _node() -> SimulatedNode:
    node = SimulatedNode("sim-node-0001", 7, cpu_cores=16, pods=20)
    node.set_batch_allocatable(12.0, 60 * 2**30)  # room for batch pods
    node.batch(T0, T0 + 10)
    return node


def test_suppress_plans_the_besteffort_quota_with_the_formula_and_stays_quiet_while_it_holds() -> None:
    node = _node()
    tick, listed = node.last_second
    assert tick is not None
    planner = SuppressPlanner(node.name, cpu_cores=node.cpu_cores)
    event = planner.plan(tick, listed, slo=ON, slo_revision=3)
    assert event is not None and event.dry_run and event.loop == "cpu-suppress" and event.slo_revision == 3
    (change,) = event.changes
    assert change.path == "cpu/kubepods/besteffort/cpu.cfs_quota_us" and change.before == "-1"
    assert change.reason.startswith("BE may use 16000m × 65% − non-BE pods ") and int(change.after) >= 2000
    assert planner.plan(tick, listed, slo=ON, slo_revision=3) is None  # the same plan: nothing new
    assert SuppressPlanner(node.name, cpu_cores=16).plan(tick, listed, slo=effective_slo(None), slo_revision=0) is None


def test_be_cgroups_name_each_batch_pods_values_once() -> None:
    node = _node()
    tick, listed = node.last_second
    assert tick is not None
    planner = BeCgroupPlanner(node.name)
    event = planner.plan(tick.at, listed, slo=ON, slo_revision=1)
    assert event is not None and event.loop == "be-cgroup" and event.dry_run
    shares = [c for c in event.changes if c.path.endswith("/cpu.shares")]
    assert shares and all(c.before == "2" and c.path.startswith("cpu/kubepods/besteffort/pod") for c in shares)
    assert not [c for c in event.changes if c.path.endswith("cpu.cfs_quota_us")]  # cfsQuota suppress: left at -1
    assert planner.plan(tick.at, listed, slo=ON, slo_revision=1) is None
