"""A simulated node's QoS loops in dry-run (agent.simulate_qos): the agent's own suppress formula, BE cgroup values
and eviction victims on synthetic cgroups, an event only when there is something new to say."""

from __future__ import annotations

from agent import evict
from agent.simulate import SimulatedNode
from agent.simulate_qos import BeCgroupPlanner, EvictPlanner, SuppressPlanner
from agent.slo import effective_slo
from koordbus.simulation import SIMULATED_THRESHOLDS

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


SIMULATED = effective_slo({"resourceUsedThresholdWithBE": SIMULATED_THRESHOLDS["clusterStrategy"]})
PEAK_HOUR = T0 % 86_400 / 3600


def _planned(node: SimulatedNode, planner: EvictPlanner, slo: dict[str, object], windows: int = 2) -> list[object]:
    events = []
    for w in range(windows):
        node.batch(T0 + 10 * w, T0 + 10 * (w + 1))
        tick, listed = node.last_second
        assert tick is not None
        events += planner.plan(tick, listed, node_cpu=node.last_node_cpu, slo=slo, slo_revision=4)
    return events


def test_a_hot_node_at_its_peak_plans_cpu_evict_of_the_pods_that_opted_in_and_says_it_once() -> None:
    node = SimulatedNode("sim-node-0001", 7, online_share=0.66, peak_hour=PEAK_HOUR)
    planner = EvictPlanner(node.name, cpu_cores=node.cpu_cores, memory_bytes=node.memory_bytes)
    (event,) = _planned(node, planner, SIMULATED)
    assert event.loop == "cpu-evict" and event.dry_run and event.slo_revision == 4 and event.node == node.name
    enabled = {f"pods/{p.pod.metadata.namespace}/{p.pod.metadata.name}" for p in node.pods()}
    for change in event.changes:
        assert change.path in enabled and change.before == "running" and change.after == evict.WOULD_REQUEST
        assert change.reason.startswith("CPUEvict: node CPU ") and "≥ threshold 75%" in change.reason
    victims = {c.path.rsplit("/", 1)[1] for c in event.changes}
    labels = {p.pod.metadata.name: p.pod.metadata.labels for p in node.pods()}
    assert all(labels[name].get(evict.EVICTION_ENABLED) == "true" for name in victims)


def test_node_memory_past_the_threshold_plans_be_memory_evict_of_batch_pods() -> None:
    node = _node()
    planner = EvictPlanner(node.name, cpu_cores=node.cpu_cores, memory_bytes=node.memory_bytes)
    low = effective_slo({"resourceUsedThresholdWithBE": {"enable": True, "memoryEvictThresholdPercent": 30}})
    events = _planned(node, planner, low, windows=1)
    (memory,) = [e for e in events if e.loop == "memory-evict"]
    assert memory.dry_run and memory.changes
    assert all(
        c.path.startswith("pods/batch/") and c.reason.startswith("BEMemoryEvict: node memory ") for c in memory.changes
    )


def test_evictions_stay_quiet_below_the_thresholds_and_when_off() -> None:
    node = SimulatedNode("sim-node-0002", 8)  # online pods at 35 % of the CPU, 40 % of the memory
    node.set_batch_allocatable(8.0, 32 * 2**30)  # about what the noderesource service gives such a node
    planner = EvictPlanner(node.name, cpu_cores=node.cpu_cores, memory_bytes=node.memory_bytes)
    assert _planned(node, planner, SIMULATED) == []
    hot = SimulatedNode("sim-node-0001", 7, online_share=0.66, peak_hour=PEAK_HOUR)
    off = EvictPlanner(hot.name, cpu_cores=hot.cpu_cores, memory_bytes=hot.memory_bytes)
    assert _planned(hot, off, effective_slo(None)) == []
