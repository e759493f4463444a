"""core.assemble_status against a plain reference, over every path it takes to find a window's samples.

The core slices sorted time arrays with binary searches and falls back to masks for unsorted ones (an
out-of-order batch appended at the end, shuffled calc input, NaN times); pod buckets are sliced when adjacent.
Each path must give the status the straightforward mask-and-loop computation gives, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from schemas import node, percentile
from services.nodemetric import aggregate, core
from services.nodemetric.aggregate import FloatArray

POLICIES = (
    node.MetricCollectPolicy(),
    node.MetricCollectPolicy(aggregate_duration_seconds=60, durations_seconds=(60, 120, 300)),
    node.MetricCollectPolicy(aggregate_duration_seconds=600, durations_seconds=(1800, 300, 600, 600)),
    node.MetricCollectPolicy(durations_seconds=()),
)
END = 1_700_000_000.0


# --- the reference: a mask per series and window, a sort per percentile, a Python loop over pod buckets


def _inside(t: float, start: float, end: float, closed: bool) -> bool:
    return start <= t and (t <= end if closed else t < end)


def _reference_maps(
    cpu: core.Series, memory: core.Series, start: float, end: float, closed: bool, min_span: float
) -> dict[str, node.ResourceMap]:
    def picked(series: core.Series) -> list[tuple[float, float]]:
        samples = zip(series.t.tolist(), series.v.tolist(), strict=True)
        return [(t, v) for t, v in samples if _inside(t, start, end, closed)]

    cpu_t = [t for t, _ in picked(cpu)]
    cpu_v = np.array([v for _, v in picked(cpu)])
    mem_v = np.array([v for _, v in picked(memory)])
    if not cpu_t or mem_v.size == 0 or max(cpu_t) - min(cpu_t) < min_span:
        return {kind: node.ResourceMap() for kind in aggregate.STATUS_AGGREGATIONS}

    def value(values: FloatArray, kind: str) -> float:
        if kind == aggregate.AVG:
            return float(values.sum() / values.size)
        return sorted(values.tolist())[percentile.nearest_rank_index(values.size, aggregate.PERCENTILES[kind])]

    return {
        kind: node.ResourceMap(resources={"cpu": int(value(cpu_v, kind) * 1000), "memory": int(value(mem_v, kind))})
        for kind in aggregate.STATUS_AGGREGATIONS
    }


def _reference_pods(buckets: core.PodBuckets, start: float, end: float, closed: bool) -> list[node.PodMetric]:
    sums: dict[int, list[float]] = {}
    for row in range(buckets.pod.size):
        if start <= buckets.t_min[row] and _inside(float(buckets.t_max[row]), -math.inf, end, closed):
            acc = sums.setdefault(int(buckets.pod[row]), [0.0, 0.0, 0.0, 0.0])
            acc[0] += float(buckets.count[row])
            acc[1] += float(buckets.cpu_sum[row])
            acc[2] += float(buckets.mem_count[row])
            acc[3] += float(buckets.mem_sum[row])
    pods = []
    for slot, (count, cpu, mem_count, mem) in sorted(sums.items()):
        info = buckets.infos[slot]
        if info is None or count <= 0 or mem_count <= 0:
            continue
        usage = node.ResourceMap(resources={"cpu": int(cpu / count * 1000), "memory": int(mem / mem_count)})
        pods.append(
            node.PodMetric(
                namespace=info.namespace,
                name=info.name,
                uid=info.uid,
                pod_usage=usage,
                priority=info.priority,
                qos=info.qos,
            )
        )
    return sorted(pods, key=lambda p: (p.namespace, p.name))


def _reference_status(sources: core.Sources, end: float, spec: node.MetricCollectPolicy) -> node.NodeMetricStatus:
    eff = core.effective_policy(spec)
    closed, window = sources.closed_end, eff.aggregate_duration_seconds

    def usage(cpu: core.Series, memory: core.Series) -> node.ResourceMap:
        return _reference_maps(cpu, memory, end - window, end, closed, -math.inf)[aggregate.AVG]

    def aggregated(cpu: core.Series, memory: core.Series) -> list[node.AggregatedUsage]:
        return [
            node.AggregatedUsage(duration_seconds=d, usage=_reference_maps(cpu, memory, end - d, end, closed, d / 2))
            for d in eff.durations_seconds
        ]

    info = node.NodeMetricInfo(
        node_usage=usage(sources.node_cpu, sources.node_memory),
        aggregated_node_usages=aggregated(sources.node_cpu, sources.node_memory),
        system_usage=usage(sources.system_cpu, sources.system_memory),
        aggregated_system_usages=aggregated(sources.system_cpu, sources.system_memory),
    )
    pods = _reference_pods(sources.pods, end - window, end, closed)
    return node.NodeMetricStatus(update_time=end, node_metric=info, pods_metric=pods)


# --- random inputs, one generator per way the samples can be ordered


def _in_order(rng: np.random.Generator, n: int) -> FloatArray:
    return np.sort(rng.uniform(END - 2000, END + 30, n))


def _on_the_grid(rng: np.random.Generator, n: int) -> FloatArray:
    return END - n + np.arange(n, dtype=np.float64) + float(rng.integers(0, 2))  # hits the window bounds exactly


def _late_batch_appended(rng: np.random.Generator, n: int) -> FloatArray:
    return np.concatenate([_in_order(rng, n), np.sort(rng.uniform(END - 1900, END - 100, 10))])


def _shuffled(rng: np.random.Generator, n: int) -> FloatArray:
    return rng.uniform(END - 2000, END + 30, n)


def _cold_start(rng: np.random.Generator, n: int) -> FloatArray:
    """Samples spanning about half of a window: the cold-start rule decides, to the second."""
    return np.linspace(END - float(rng.choice([30.0, 60.0, 150.0, 300.0])), END - 1, n) + float(rng.integers(0, 2))


def _with_nan(rng: np.random.Generator, n: int) -> FloatArray:
    t = _in_order(rng, n)
    t[n // 2] = math.nan
    return t


ORDERINGS: dict[str, Callable[[np.random.Generator, int], FloatArray]] = {
    "in order": _in_order,
    "on the grid": _on_the_grid,
    "late batch appended": _late_batch_appended,
    "shuffled": _shuffled,
    "cold start": _cold_start,
    "with NaN": _with_nan,
}


def _series_pair(rng: np.random.Generator, times: FloatArray, *, shared: bool) -> tuple[core.Series, core.Series]:
    cpu = rng.uniform(0, 64, times.size)
    cpu[: times.size // 4] = np.round(cpu[: times.size // 4])  # ties
    memory_times = times if shared else _in_order(rng, times.size // 2)
    memory = rng.integers(0, 2**40, memory_times.size).astype(np.float64)
    return core.Series(times, cpu), core.Series(memory_times, memory)


def _buckets(rng: np.random.Generator, *, adjacent: bool) -> core.PodBuckets:
    slots, rows = 30, 600
    t_min = np.sort(rng.uniform(END - 400, END + 20, rows)) if adjacent else rng.uniform(END - 400, END + 20, rows)
    count = rng.integers(1, 11, rows).astype(np.float64)
    mem_count = np.where(rng.random(rows) < 0.1, 0.0, count)
    infos = [
        None if slot % 11 == 3 else core.PodInfo(f"ns{slot % 3}", f"pod{slot % 13}", f"uid-{slot}", "koord-prod", "LS")
        for slot in range(slots)
    ]
    return core.PodBuckets(
        pod=rng.integers(0, slots, rows).astype(np.int64),
        count=count,
        cpu_sum=count * rng.uniform(0, 8, rows),
        mem_count=mem_count,
        mem_sum=mem_count * rng.integers(0, 2**36, rows),
        t_min=t_min,
        t_max=t_min + rng.uniform(0, 12, rows),
        infos=infos,
    )


@pytest.mark.parametrize("ordering", ORDERINGS)
@pytest.mark.parametrize("closed", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_status_matches_the_reference(ordering: str, closed: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    make_times = ORDERINGS[ordering]
    node_cpu, node_memory = _series_pair(rng, make_times(rng, 1900), shared=seed != 2)
    system_cpu, system_memory = _series_pair(rng, make_times(rng, 700), shared=True)
    sources = core.Sources(
        node_cpu=node_cpu,
        node_memory=node_memory,
        system_cpu=system_cpu,
        system_memory=system_memory,
        pods=_buckets(rng, adjacent=seed != 1),
        closed_end=closed,
    )
    for spec in POLICIES:
        assert core.assemble_status(sources, report_time=END, spec=spec) == _reference_status(sources, END, spec)


@pytest.mark.parametrize(
    ("times", "sliced"),
    [
        ([1.0, 2.0, 2.0, 3.0], True),
        ([1.0, 3.0, 2.0], False),
        ([1.0, math.nan, 3.0], False),
        ([], True),
        ([math.nan], True),
    ],
)
def test_windows_slice_only_times_in_order(times: list[float], sliced: bool) -> None:
    t = np.array(times, dtype=np.float64)
    starts = [1.5, 0.0]
    selections = core._Windows(starts, end=3.0, closed=False).of(t)
    assert all(isinstance(s, slice) is sliced for s in selections)
    for start, selection in zip(starts, selections, strict=True):
        assert t[selection].tolist() == t[core.Span(start, 3.0, False).mask(t, t)].tolist()


def test_windows_are_located_once_per_distinct_times() -> None:
    windows = core._Windows([0.0], end=5.0, closed=True)
    t = np.arange(10, dtype=np.float64)
    assert windows.of(t) is windows.of(t.copy())  # equal times share their selections
    assert windows.of(t + 1) is not windows.of(t)
    with_nan = np.array([0.0, math.nan])
    assert windows.of(with_nan) is not windows.of(with_nan.copy())  # NaN equals nothing: located again, same result


def test_nan_report_time_matches_nothing() -> None:
    t = np.arange(10, dtype=np.float64)
    (selection,) = core._Windows([0.0], end=math.nan, closed=True).of(t)
    assert t[selection].size == 0


@pytest.mark.parametrize("seed", range(5))
def test_status_values_match_a_full_sort(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for n in (1, 2, 3, 10, 99, 100, 301, 1800):
        values = np.round(rng.uniform(-5, 5, n), 1)  # ties and zeros
        ordered = sorted(values.tolist())
        expected = [float(values.sum() / n)] + [
            ordered[percentile.nearest_rank_index(n, p)] for p in aggregate.PERCENTILES.values()
        ]
        assert aggregate.status_values(values) == expected
        assert aggregate.status_aggregates(values) == dict(zip(aggregate.STATUS_AGGREGATIONS, expected, strict=True))


def test_pod_amounts_beyond_int64_and_nan_behave_like_int() -> None:
    infos = [core.PodInfo("ns", "huge", "", "", ""), core.PodInfo("ns", "nan", "", "", "")]

    def buckets(cpu_sum: float) -> core.PodBuckets:
        one = np.ones(1)
        return core.PodBuckets(
            pod=np.zeros(1, dtype=np.int64),
            count=one,
            cpu_sum=np.array([cpu_sum]),
            mem_count=one,
            mem_sum=np.array([3e30]),
            t_min=np.array([END - 1]),
            t_max=np.array([END - 1]),
            infos=infos,
        )

    (pod,) = core._pod_metrics(buckets(2.5e20), core.Span(END - 300, END, False))
    assert pod.pod_usage.resources == {"cpu": int(2.5e20 * 1000), "memory": int(3e30)}
    with pytest.raises(ValueError, match="NaN"):
        core._pod_metrics(buckets(math.nan), core.Span(END - 300, END, False))
