"""agent.suppress (spec §5.5.1): the BE allowance with its terms, the cfsQuota policy's target with its floor, skip
band and growth cap, the cpuset policy's size and CPU choice, and the kernel's cpu list format."""

from __future__ import annotations

import json

import msgspec
import pytest

from agent import suppress
from agent.actuate import NodePod
from agent.suppress import Cpu
from schemas import kube
from tests.unit.test_agent_actuate import be_pod

BE_UID = "3f1e2d3c-0000-4000-8000-000000000001"
LS_UID = "3f1e2d3c-0000-4000-8000-000000000002"


def test_allowance_takes_off_non_be_pods_and_the_system() -> None:
    pods = [be_pod(BE_UID), be_pod(LS_UID, label="LS", name="web", kube_qos="Burstable")]
    allowance = suppress.be_allowance(
        capacity_milli=16_000,
        node_used_milli=10_000,
        pod_used_milli={BE_UID: 3000, LS_UID: 4000, "unknown-pod": 500},
        pods=pods,
        threshold_percent=65,
        min_percent=None,
    )
    # system = 10000 − (3000 + 4000 + 500) = 2500; non-BE = 4000 + 500 (unknown counts as non-BE)
    assert allowance.milli == 10_400 - 4500 - 2500
    assert "non-BE pods 4500m" in allowance.explanation and "system 2500m" in allowance.explanation


def test_allowance_floors_and_reserved() -> None:
    kwargs = dict(
        capacity_milli=8000, node_used_milli=8000, pod_used_milli={LS_UID: 7000}, pods=[], threshold_percent=65
    )
    assert suppress.be_allowance(**kwargs, min_percent=None).milli == 5200 - 7000 - 1000  # may go negative
    floored = suppress.be_allowance(**kwargs, min_percent=10)
    assert floored.milli == 800 and "cpuSuppressMinPercent" in floored.explanation
    reserved = suppress.be_allowance(**kwargs, min_percent=None, node_reserved_milli=2000)
    assert reserved.milli == 5200 - 7000 - 2000


def test_cfs_quota_target() -> None:
    assert suppress.cfs_quota_target(4000, current=-1, cpus=16) == 400_000
    assert suppress.cfs_quota_target(-500, current=-1, cpus=16) == 2000  # never below the floor
    # growth capped at 10% of the node per round (16 cores → 160000 µs)
    assert suppress.cfs_quota_target(12_000, current=400_000, cpus=16) == 560_000
    # shrinking is not capped
    assert suppress.cfs_quota_target(1000, current=400_000, cpus=16) == 100_000
    # a move under 1% of the node (16000 µs) is skipped, unless to the floor
    assert suppress.cfs_quota_target(4100, current=400_000, cpus=16) is None
    assert suppress.cfs_quota_target(0, current=3000, cpus=16) == 2000


def test_cpuset_size() -> None:
    assert suppress.cpuset_size(500, old_size=16, logical_cpus=16) == 2  # at least 2
    assert suppress.cpuset_size(7_200, old_size=16, logical_cpus=16) == 8
    assert suppress.cpuset_size(15_000, old_size=4, logical_cpus=16) == 6  # grows ≤ ceil(10% of 16) per round
    assert suppress.cpuset_size(99_000, old_size=16, logical_cpus=16) == 16


def _machine() -> list[Cpu]:
    """2 sockets × 4 cores × 2 threads; socket s core c has CPUs c + 8s and c + 8s + 4 (Linux numbering)."""
    cpus = []
    for socket in range(2):
        for core in range(4):
            for thread in range(2):
                cpus.append(Cpu(id=core + 8 * socket + 4 * thread, core=core, socket=socket, numa=socket))
    return cpus


def test_pick_cpus_spreads_over_sockets_with_siblings_together() -> None:
    machine = _machine()
    assert suppress.pick_cpus(machine, 2) == [0, 4]  # one sibling pair
    assert suppress.pick_cpus(machine, 4) == [0, 4, 8, 12]  # a pair per socket
    assert suppress.pick_cpus(machine, 5) == [0, 1, 4, 8, 12]  # then singles round-robin
    assert suppress.pick_cpus(machine, 99) == sorted(c.id for c in machine)
    no_smt = [Cpu(id=i, core=i, socket=0, numa=0) for i in range(4)]
    assert suppress.pick_cpus(no_smt, 3) == [0, 1, 2]


@pytest.mark.parametrize(
    ("text", "ids"), [("0-3,8", {0, 1, 2, 3, 8}), ("", set()), ("5", {5}), ("0-1,3-4\n", {0, 1, 3, 4})]
)
def test_cpu_lists(text: str, ids: set[int]) -> None:
    assert suppress.parse_cpuset(text) == ids
    assert suppress.parse_cpuset(suppress.format_cpuset(ids)) == ids
    assert suppress.format_cpuset({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"


@pytest.mark.parametrize("bad", ["3-1", "a", "1-"])
def test_bad_cpu_lists(bad: str) -> None:
    with pytest.raises(ValueError):
        suppress.parse_cpuset(bad)


# --- the opt-in PSI rule (issue 23, point 6)

RULE = suppress.PsiRule(threshold=0.3, step_percent=10)


def test_psi_step_is_off_without_a_rule_and_under_the_threshold() -> None:
    pods = [be_pod(BE_UID), be_pod(LS_UID, label="LS", name="web", kube_qos="Burstable")]
    kwargs = dict(pods=pods, capacity_milli=8000)
    assert suppress.psi_step(None, cpu_some={LS_UID: 0.9}, **kwargs) is None  # off by default
    assert suppress.psi_step(RULE, cpu_some={LS_UID: 0.29}, **kwargs) is None
    assert suppress.psi_step(RULE, cpu_some={}, **kwargs) is None  # no PSI: nothing, not zero pressure
    # only LS pods count: a stalled BE pod (or one the list does not know) raises nothing
    assert suppress.psi_step(RULE, cpu_some={BE_UID: 0.9, "unknown": 0.9}, **kwargs) is None


def test_psi_step_lowers_the_allowance_before_the_floor_and_says_why() -> None:
    pods = [be_pod(BE_UID), be_pod(LS_UID, label="LS", name="web", kube_qos="Burstable")]
    step = suppress.psi_step(RULE, cpu_some={LS_UID: 0.3, BE_UID: 0.9}, pods=pods, capacity_milli=8000)
    assert step is not None and step.milli == 800
    assert f"pod {LS_UID} cpu some 0.300 ≥ 0.3" in step.explanation
    kwargs = dict(capacity_milli=8000, node_used_milli=4000, pod_used_milli={LS_UID: 2000}, pods=pods)
    plain = suppress.be_allowance(**kwargs, threshold_percent=65, min_percent=None)
    pressed = suppress.be_allowance(**kwargs, threshold_percent=65, min_percent=None, pressure=step)
    assert pressed.milli == plain.milli - 800
    assert "LS CPU pressure step 800m" in pressed.explanation and pressed.explanation.endswith(f"= {pressed.milli}m")
    floored = suppress.be_allowance(**kwargs, threshold_percent=20, min_percent=10, pressure=step)
    assert floored.milli == 800  # cpuSuppressMinPercent still holds


def test_a_kube_guaranteed_pod_without_a_koord_label_counts_as_ls() -> None:
    pods = [be_pod(LS_UID, label="", name="db", kube_qos="Guaranteed")]
    assert suppress.psi_step(RULE, cpu_some={LS_UID: 0.5}, pods=pods, capacity_milli=4000) is not None


# --- CPUs BE must not get (issue 23, point 3)


def _allocated(uid: str, qos: str, cpuset: str, *, phase: str = "Running") -> NodePod:
    pod = msgspec.convert(
        {
            "metadata": {
                "name": f"pod-{uid}",
                "namespace": "default",
                "uid": uid,
                "labels": {"koordinator.sh/qosClass": qos},
                "annotations": {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": cpuset})},
            },
            "status": {"phase": phase, "qosClass": "Guaranteed"},
        },
        kube.Pod,
    )
    return NodePod(pod=pod)


EIGHT = [suppress.Cpu(id=i, core=i % 4, socket=0, numa=0) for i in range(8)]


def test_be_pools_leave_out_reserved_and_lse_cpus_and_set_the_lsr_pool_apart() -> None:
    pods = [
        _allocated("lse", "LSE", "2-3"),
        _allocated("lsr", "LSR", "4-5"),
        _allocated("done", "LSE", "6", phase="Succeeded"),  # a finished pod holds nothing
        _allocated("ls", "LS", "7"),  # only LSE and LSR allocations count
    ]
    pools = suppress.be_cpu_pools(EIGHT, pods, reserved=frozenset({0}))
    assert [c.id for c in pools.lsr] == [4, 5]
    assert [c.id for c in pools.ls] == [1, 6, 7]
    assert pools.excluded == {0: "reserved", 2: "LSE pods'", 3: "LSE pods'"}
    assert pools.why_not() == "; not LSE pods' 2-3, reserved 0"
    # koordlet's split: lsrCount = floor(n × |LSR| / (|LSR| + |LS|)) = floor(4 × 2 / 5) = 1, the rest from LS
    picked = suppress.pick_be_cpus(pools, 4)
    assert len(picked) == 4 and len(set(picked) & {4, 5}) == 1 and not set(picked) & {0, 2, 3}
    assert suppress.pick_be_cpus(pools, 99) == [1, 4, 5, 6, 7]  # never more than the pools hold


def test_a_short_pool_is_made_up_from_the_other() -> None:
    pools = suppress.be_cpu_pools(EIGHT, [_allocated("lsr", "LSR", "1-7")], reserved=frozenset())
    assert [c.id for c in pools.ls] == [0]
    # lsrCount = floor(3 × 7 / 8) = 2, LS gives its one CPU
    picked = suppress.pick_be_cpus(pools, 3)
    assert len(picked) == 3 and 0 in picked


@pytest.mark.parametrize("cpuset", ["0-999999999", "7-3", "x", "-1"])
def test_a_hostile_or_broken_allocation_excludes_nothing(cpuset: str) -> None:
    pools = suppress.be_cpu_pools(EIGHT, [_allocated("lse", "LSE", cpuset)], reserved=frozenset())
    assert pools.ids == set(range(8)) and pools.excluded == {}


def test_cpu_lists_are_bounded() -> None:
    with pytest.raises(ValueError, match="above 8191"):
        suppress.parse_cpuset("0-100000000")
    assert suppress.parse_cpuset("8191") == {8191}
