"""Per-NUMA-node usage (agent.numa, issue 22 point 3): the meminfo and numa_stat arithmetic, the sampler, and the
NUMA usages of the NodeMetric status (services.nodemetric.window) in Koordinator's shape (validated against its CRD)."""

from __future__ import annotations

import pytest

from agent import numa
from schemas import koordinator
from schemas.node import MetricCollectPolicy, NodeMetricsReported
from services.nodemetric.window import NodeWindow, compute_status
from tests.support import crd

GiB = 1 << 30
MEMINFO = """Node 1 MemTotal:       16000000 kB
Node 1 MemFree:         4000000 kB
Node 1 MemUsed:        12000000 kB
Node 1 Active(file):    1000000 kB
Node 1 Inactive(file):   500000 kB
Node 1 SReclaimable:     250000 kB
Node 1 Shmem:              1000 kB
"""


def test_numa_memory_is_total_less_free_file_pages_and_reclaimable_slab() -> None:
    assert numa.numa_memory_bytes(MEMINFO) == (16_000_000 - 4_000_000 - 1_000_000 - 500_000 - 250_000) * 1024
    assert numa.numa_memory_bytes("Node 0 MemTotal: 100 kB\nNode 0 MemFree: 150 kB\n") == 0  # clamped
    with pytest.raises(KeyError):
        numa.numa_memory_bytes("Node 0 MemUsed: 100 kB\n")


def test_pod_numa_memory_from_numa_stat_v1_pages_and_v2_bytes() -> None:
    v1 = "total=10 N0=10 N1=0\nfile=4 N0=4\nhierarchical_total=300 N0=100 N1=200\nhierarchical_file=5 N0=5\n"
    assert numa.pod_numa_bytes(v1, 1, 4096) == {0: 100 * 4096, 1: 200 * 4096}
    v2 = "anon N0=1000 N1=2000\nfile N0=10 N1=20\nkernel_stack N0=7\nunevictable N1=5\nshmem N0=99\n"
    assert numa.pod_numa_bytes(v2, 2, 4096) == {0: 1010, 1: 2025}
    assert numa.pod_numa_bytes("anon N0=x Nq=3 junk\n", 2, 4096) == {}


def test_the_sampler_gives_cores_per_numa_node_and_apportions_the_system_cpu() -> None:
    sampler = numa.NumaSampler()
    first = [
        numa.NumaReading(id=0, busy_ticks=1000, memory=8 * GiB),
        numa.NumaReading(id=1, busy_ticks=500, memory=GiB),
    ]
    assert sampler.observe(first, wall_seconds=0.0, ticks_per_second=100, system_cpu=None, pods_on_numa={}) == ()
    later = [
        numa.NumaReading(id=0, busy_ticks=1300, memory=8 * GiB),
        numa.NumaReading(id=1, busy_ticks=600, memory=GiB),
    ]
    samples = sampler.observe(later, wall_seconds=1.0, ticks_per_second=100, system_cpu=2.0, pods_on_numa={0: 3 * GiB})
    assert [(s.id, s.cpu, s.memory, s.system_memory) for s in samples] == [
        (0, 3.0, 8 * GiB, 5 * GiB),
        (1, 1.0, GiB, GiB),
    ]
    assert [round(s.system_cpu, 9) for s in samples] == [1.5, 0.5]  # 2 cores split 3:1
    went_back = [numa.NumaReading(id=0, busy_ticks=10, memory=GiB)]
    assert sampler.observe(went_back, wall_seconds=1.0, ticks_per_second=100, system_cpu=1.0, pods_on_numa={}) == ()


def batch(start: float, rows: list[tuple[float, int, float, int, float, int]]) -> NodeMetricsReported:
    return NodeMetricsReported(
        node="numa-node", window_start=start, window_end=start + 10, sent_at=start + 10, numa_samples=rows
    )


def test_the_status_averages_each_numa_node_over_the_aggregate_window_in_koordinators_shape() -> None:
    spec = MetricCollectPolicy(aggregate_duration_seconds=60, report_interval_seconds=60, durations_seconds=(60,))
    window = NodeWindow(spec)
    t0 = 1_800_000_000.0
    window.add(batch(t0 - 60, [(t0 - 55, 0, 9.0, 9 * GiB, 9.0, GiB)]))  # before the window: not counted
    for k in range(6):
        start = t0 + 10 * k
        rows = [(start + s, n, 1.0 + n + k, (2 + n) * GiB, 0.5, GiB // 2) for s in range(10) for n in (0, 1, 3)]
        if k < 3:
            rows = [r for r in rows if r[1] != 3]  # NUMA node 3 reports from the second half on
        window.add(batch(start, rows))
    status = compute_status(window, report_time=t0 + 60, spec=spec)
    usages = {u.numa_node_id: u for u in status.node_metric.numa_usages}
    assert sorted(usages) == [0, 1, 3]
    assert usages[0].node_usage.resources == {"cpu": 3500, "memory": 2 * GiB}  # avg of 1..6 cores
    assert usages[3].node_usage.resources == {"cpu": 8000, "memory": 5 * GiB}  # avg of 7..9
    assert usages[1].system_usage.resources == {"cpu": 500, "memory": GiB // 2}
    rendered = koordinator.nodemetric_object("numa-node", spec, status)
    assert [u["numaNodeID"] for u in rendered["status"]["nodeMetric"]["numaUsages"]] == [0, 1, 3]
    crd.assert_valid_nodemetric(rendered)
    empty = compute_status(NodeWindow(spec), report_time=t0, spec=spec)
    assert "numaUsages" not in koordinator.nodemetric_object("n", spec, empty).get("status", {}).get("nodeMetric", {})
