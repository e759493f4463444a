"""agent.suppress (spec §5.5.1): the BE allowance with its terms, the cfsQuota policy's target with its floor, skip
band and growth cap, the cpuset policy's size and CPU choice, and the kernel's cpu list format."""

from __future__ import annotations

import pytest

from agent import suppress
from agent.suppress import Cpu
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
