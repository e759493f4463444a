"""Pure NodeMetric calculations (spec §1.5–1.6): aggregations, per-node sample windows and the status they yield.

Callers: services/nodemetric/service.py feeds each node's NodeMetricsReported batches into a `NodeWindow`,
asks `due_report` when a report round is due and publishes `compute_status`; `koordbus calc` runs
`aggregate` and `compute_from_samples` on raw samples. Time is always a parameter: report times are derived
from event time (multiples of the report interval), so replaying a stream yields identical reports.

Windows. The calc path queries [T − w, T] like Koordinator's TSDB. The streaming path queries [T − w, T): the
sample at exactly T belongs to the batch [T, T + interval), and a report must not depend on whether that batch
had arrived when it was computed, or replays would differ.

Memory model. Node, system and node-memory-variant samples are kept raw in numpy columns bounded by the
longest window plus one report interval, so percentiles are exact. Pod samples are kept only as one bucket
per pod per batch (count, sums, first and last sample time) for the aggregate window: a bucket counts toward
a window iff start ≤ t_min and t_max is before the end. That is exact when report times fall on batch
boundaries — the agent cuts batches on multiples of its publish interval, which divides the report interval —
and otherwise it leaves out the batch straddling each window edge. `compute_from_samples` uses one bucket
per sample, so the calc path is always exact. Pod memory under usageWithHotPageCache uses the
without-page-cache samples: the agent reports no per-pod hot-page series. The module is long because the
aggregations, both input paths and the window share private types that would otherwise have to be public.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas import koordinator, node, vocab
from schemas.resources import CPU, MEMORY

FloatArray = npt.NDArray[np.float64]

AVG, P50, P90, P95, P99, LAST, COUNT = "avg", "p50", "p90", "p95", "p99", "last", "count"
PERCENTILES: Mapping[str, float] = {P50: 0.5, P90: 0.9, P95: 0.95, P99: 0.99}
STATUS_AGGREGATIONS = (AVG, P50, P90, P95, P99)
AGGREGATIONS = (*STATUS_AGGREGATIONS, LAST, COUNT)

MIN_REPORT_INTERVAL_SECONDS = 30
MIN_AGGREGATE_WINDOW_SECONDS = 60
COLD_START_RATIO = 0.5
_SERIES_SLACK_ROWS = 128  # room for one batch on top of a full window at 1 sample/s
_POD_TABLE_INITIAL_ROWS = 64


class AggregationError(ValueError):
    """A query Koordinator's metric cache rejects: no samples in the window, or an unknown aggregation."""


# --- aggregation functions (§1.5)


def _array(values: Iterable[float] | FloatArray) -> FloatArray:
    return np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64)


def _values(values: Iterable[float] | FloatArray) -> FloatArray:
    arr = _array(values)
    if arr.size == 0:
        raise AggregationError("no samples to aggregate")
    return arr


def avg(values: Iterable[float] | FloatArray) -> float:
    arr = _values(values)
    return float(arr.sum() / arr.size)


def nearest_rank_index(n: int, p: float) -> int:
    """Koordinator's percentile index: int(float32(n) × float32(p)) − 1, at least 0 (the product is float32)."""
    product = np.float32(n) * np.float32(p)
    return max(int(product) - 1, 0)


def percentile(values: Iterable[float] | FloatArray, p: float) -> float:
    """Nearest-rank percentile without interpolation: the sorted value at `nearest_rank_index`."""
    arr = _values(values)
    idx = nearest_rank_index(arr.size, p)
    return float(np.partition(arr, idx)[idx])


def last(values: Iterable[float] | FloatArray, times: Iterable[float] | FloatArray | None = None) -> float:
    """The value with the latest timestamp (the last one when times are not given or tie)."""
    arr = _values(values)
    if times is None:
        return float(arr[-1])
    t = _array(times)
    return float(arr[t.size - 1 - int(np.argmax(t[::-1]))])


def count(values: Iterable[float] | FloatArray) -> int:
    """Number of samples; unlike the others it answers 0 for none, as Koordinator's Count() does."""
    return int(_array(values).size)


def aggregate(name: str, values: Iterable[float] | FloatArray) -> float:
    """One aggregation by its Koordinator name; samples are in time order."""
    arr = _array(values)
    match name:
        case "avg":
            return avg(arr)
        case "p50" | "p90" | "p95" | "p99":
            return percentile(arr, PERCENTILES[name])
        case "last":
            return last(arr)
        case "count":
            return count(arr)
        case _:
            raise AggregationError(f"unknown aggregation {name!r} (known: {', '.join(AGGREGATIONS)})")


def _status_aggregates(arr: FloatArray) -> dict[str, float]:
    """avg and the four percentiles of a non-empty window with one sort."""
    ordered = np.sort(arr)
    out = {AVG: float(arr.sum() / arr.size)}
    for name, p in PERCENTILES.items():
        out[name] = float(ordered[nearest_rank_index(arr.size, p)])
    return out


# --- policy


def effective_policy(spec: node.MetricCollectPolicy) -> node.MetricCollectPolicy:
    """koordlet's floors (§1.3): reports at least 30 s apart, averages over at least 60 s."""
    return node.MetricCollectPolicy(
        aggregate_duration_seconds=max(spec.aggregate_duration_seconds, MIN_AGGREGATE_WINDOW_SECONDS),
        report_interval_seconds=max(spec.report_interval_seconds, MIN_REPORT_INTERVAL_SECONDS),
        durations_seconds=spec.durations_seconds,
        node_memory_collect_policy=spec.node_memory_collect_policy,
    )


def _retention_seconds(spec: node.MetricCollectPolicy) -> tuple[float, float]:
    """(raw-sample horizon, pod-bucket horizon): a window plus one report interval of lag behind the newest batch."""
    eff = effective_policy(spec)
    longest = max((eff.aggregate_duration_seconds, *eff.durations_seconds))
    return float(longest + eff.report_interval_seconds), float(
        eff.aggregate_duration_seconds + eff.report_interval_seconds
    )


# --- the window inputs, shared by the streaming and the calc path


@dataclass(frozen=True)
class _Span:
    """A query window [start, end], or [start, end) on the streaming path (see the module docstring)."""

    start: float
    end: float
    closed: bool

    def mask(self, t_first: FloatArray, t_last: FloatArray) -> npt.NDArray[np.bool_]:
        before_end = t_last <= self.end if self.closed else t_last < self.end
        return (t_first >= self.start) & before_end


@dataclass(frozen=True)
class _Series:
    t: FloatArray
    v: FloatArray

    def within(self, span: _Span) -> _Series:
        mask = span.mask(self.t, self.t)
        return _Series(self.t[mask], self.v[mask])


@dataclass(frozen=True)
class _PodInfo:
    namespace: str
    name: str
    uid: str
    priority: str
    qos: str


@dataclass(frozen=True)
class _PodBuckets:
    """Columns of one row per (pod, bucket); `pod` indexes `infos` (None marks a free slot)."""

    pod: npt.NDArray[np.int64]
    count: FloatArray
    cpu_sum: FloatArray
    mem_count: FloatArray
    mem_sum: FloatArray
    t_min: FloatArray
    t_max: FloatArray
    infos: Sequence[_PodInfo | None]


@dataclass(frozen=True)
class _Sources:
    node_cpu: _Series
    node_memory: _Series
    system_cpu: _Series
    system_memory: _Series
    pods: _PodBuckets
    closed_end: bool  # calc queries [start, end] like Koordinator; the stream [start, end), see the docstring

    def span(self, end: float, duration: float) -> _Span:
        return _Span(end - duration, end, self.closed_end)


@dataclass(frozen=True)
class WindowCount:
    """How many samples one window of a report held (for `explain` output and the service's event)."""

    duration_seconds: int
    start: float
    end: float
    node_samples: int
    system_samples: int
    pod_samples: int | None = None  # counted for the aggregate window only


def _millicores(cores: float) -> int:
    return int(cores * 1000)


def _usage_maps(
    cpu: _Series, memory: _Series, span: _Span, *, kinds: Sequence[str], min_span: float
) -> dict[str, node.ResourceMap]:
    """One ResourceMap per aggregation kind; all empty when a query has no samples or the CPU span is too short."""
    cpu_w, mem_w = cpu.within(span), memory.within(span)
    if cpu_w.t.size == 0 or mem_w.t.size == 0 or float(cpu_w.t.max() - cpu_w.t.min()) < min_span:
        return {kind: node.ResourceMap() for kind in kinds}
    cpu_agg, mem_agg = _status_aggregates(cpu_w.v), _status_aggregates(mem_w.v)
    return {
        kind: node.ResourceMap(resources={CPU: _millicores(cpu_agg[kind]), MEMORY: int(mem_agg[kind])})
        for kind in kinds
    }


def _average(cpu: _Series, memory: _Series, span: _Span) -> node.ResourceMap:
    """nodeUsage / systemUsage: the avg with no cold-start filter."""
    return _usage_maps(cpu, memory, span, kinds=(AVG,), min_span=-math.inf)[AVG]


def _aggregated(
    sources: _Sources, cpu: _Series, memory: _Series, *, end: float, durations: Iterable[int]
) -> list[node.AggregatedUsage]:
    """One entry per duration; a window whose CPU samples span less than half of it stays empty (cold start)."""
    return [
        node.AggregatedUsage(
            duration_seconds=d,
            usage=_usage_maps(
                cpu, memory, sources.span(end, d), kinds=STATUS_AGGREGATIONS, min_span=COLD_START_RATIO * d
            ),
        )
        for d in durations
    ]


def _pod_metrics(buckets: _PodBuckets, span: _Span) -> list[node.PodMetric]:
    inside = span.mask(buckets.t_min, buckets.t_max)
    idx = buckets.pod[inside]
    size = len(buckets.infos)
    counts = np.bincount(idx, weights=buckets.count[inside], minlength=size)
    cpu = np.bincount(idx, weights=buckets.cpu_sum[inside], minlength=size)
    mem_counts = np.bincount(idx, weights=buckets.mem_count[inside], minlength=size)
    mem = np.bincount(idx, weights=buckets.mem_sum[inside], minlength=size)
    metrics = []
    for i in np.flatnonzero((counts > 0) & (mem_counts > 0)).tolist():
        info = buckets.infos[i]
        if info is None:
            continue
        usage = {CPU: _millicores(cpu[i] / counts[i]), MEMORY: int(mem[i] / mem_counts[i])}
        metrics.append(
            node.PodMetric(
                namespace=info.namespace,
                name=info.name,
                uid=info.uid,
                pod_usage=node.ResourceMap(resources=usage),
                priority=info.priority,
                qos=info.qos,
            )
        )
    return sorted(metrics, key=lambda m: (m.namespace, m.name))


def _status(sources: _Sources, *, report_time: float, spec: node.MetricCollectPolicy) -> node.NodeMetricStatus:
    eff = effective_policy(spec)
    window = sources.span(report_time, eff.aggregate_duration_seconds)
    durations = eff.durations_seconds
    info = node.NodeMetricInfo(
        node_usage=_average(sources.node_cpu, sources.node_memory, window),
        aggregated_node_usages=_aggregated(
            sources, sources.node_cpu, sources.node_memory, end=report_time, durations=durations
        ),
        system_usage=_average(sources.system_cpu, sources.system_memory, window),
        aggregated_system_usages=_aggregated(
            sources, sources.system_cpu, sources.system_memory, end=report_time, durations=durations
        ),
    )
    pods = _pod_metrics(sources.pods, window)
    return node.NodeMetricStatus(update_time=report_time, node_metric=info, pods_metric=pods)


def _counts(sources: _Sources, *, report_time: float, spec: node.MetricCollectPolicy) -> list[WindowCount]:
    eff = effective_policy(spec)
    aggregate_window = sources.span(report_time, eff.aggregate_duration_seconds)
    pods = sources.pods
    pod_samples = int(pods.count[aggregate_window.mask(pods.t_min, pods.t_max)].sum())
    out = [_count_window(sources, eff.aggregate_duration_seconds, report_time, pod_samples)]
    out.extend(_count_window(sources, d, report_time, None) for d in eff.durations_seconds)
    return out


def _count_window(sources: _Sources, duration: int, end: float, pod_samples: int | None) -> WindowCount:
    span = sources.span(end, duration)
    return WindowCount(
        duration_seconds=duration,
        start=span.start,
        end=end,
        node_samples=int(sources.node_cpu.within(span).t.size),
        system_samples=int(sources.system_cpu.within(span).t.size),
        pod_samples=pod_samples,
    )


# --- the calc path: raw samples, one bucket per sample


@dataclass(frozen=True)
class PodSeries:
    """A pod's samples as `koordbus calc nodemetric` gives them: priority and qos already decided."""

    namespace: str
    name: str
    samples: Sequence[tuple[float, float, float]]
    priority: str = ""
    qos: str = ""


def _rows(samples: Sequence[Sequence[float]], width: int) -> FloatArray:
    return np.asarray(samples, dtype=np.float64).reshape(-1, width)


def _samples_sources(
    node_samples: Sequence[tuple[float, float, float]],
    system_samples: Sequence[tuple[float, float, float]],
    pods: Sequence[PodSeries],
) -> _Sources:
    nodes, system = _rows(node_samples, 3), _rows(system_samples, 3)
    per_pod = [_rows(p.samples, 3) for p in pods]
    rows = np.concatenate([*per_pod, np.empty((0, 3))])
    ones = np.ones(rows.shape[0])
    buckets = _PodBuckets(
        pod=np.repeat(np.arange(len(pods), dtype=np.int64), [r.shape[0] for r in per_pod]),
        count=ones,
        cpu_sum=rows[:, 1],
        mem_count=ones,
        mem_sum=rows[:, 2],
        t_min=rows[:, 0],
        t_max=rows[:, 0],
        infos=[_PodInfo(p.namespace, p.name, "", p.priority, p.qos) for p in pods],
    )
    return _Sources(
        node_cpu=_Series(nodes[:, 0], nodes[:, 1]),
        node_memory=_Series(nodes[:, 0], nodes[:, 2]),
        system_cpu=_Series(system[:, 0], system[:, 1]),
        system_memory=_Series(system[:, 0], system[:, 2]),
        pods=buckets,
        closed_end=True,
    )


def compute_from_samples(
    *,
    report_time: float,
    spec: node.MetricCollectPolicy,
    node_samples: Sequence[tuple[float, float, float]],
    system_samples: Sequence[tuple[float, float, float]] = (),
    pods: Sequence[PodSeries] = (),
) -> node.NodeMetricStatus:
    """The status of §1.6 from raw (t, cores, bytes) samples; node memory is the column given, whatever the policy."""
    sources = _samples_sources(node_samples, system_samples, pods)
    return _status(sources, report_time=report_time, spec=spec)


def count_from_samples(
    *,
    report_time: float,
    spec: node.MetricCollectPolicy,
    node_samples: Sequence[tuple[float, float, float]],
    system_samples: Sequence[tuple[float, float, float]] = (),
    pods: Sequence[PodSeries] = (),
) -> list[WindowCount]:
    """Sample counts per window for the same input as `compute_from_samples`."""
    sources = _samples_sources(node_samples, system_samples, pods)
    return _counts(sources, report_time=report_time, spec=spec)


# --- the streaming path

_F8, _I8 = np.dtype(np.float64), np.dtype(np.int64)
_SAMPLE_COLUMNS = {"t": _F8, "cpu": _F8, "mem": _F8}
_MEMORY_COLUMNS = {"t": _F8, "mem": _F8}
_POD_COLUMNS = {
    "pod": _I8,
    "count": _F8,
    "cpu_sum": _F8,
    "mem_sum": _F8,
    "pc_count": _F8,
    "pc_sum": _F8,
    "t_min": _F8,
    "t_max": _F8,
}


class _Table:
    """Numpy columns whose rows [0, size) are live; expired rows are squeezed out in place.

    Arrays are allocated on first use and grow (doubling) only when live rows outgrow them, so a node under
    steady load allocates nothing per batch.
    """

    def __init__(self, dtypes: Mapping[str, np.dtype[np.generic]], initial_rows: int) -> None:
        self._dtypes = dict(dtypes)
        self._initial_rows = initial_rows
        self._cols: dict[str, npt.NDArray[np.generic]] = {name: np.empty(0, dtype) for name, dtype in dtypes.items()}
        self.size = 0

    @property
    def capacity(self) -> int:
        return len(next(iter(self._cols.values())))

    def col(self, name: str) -> npt.NDArray[Any]:
        return self._cols[name][: self.size]

    def append(self, columns: Mapping[str, npt.ArrayLike], rows: int) -> None:
        needed = self.size + rows
        if needed > self.capacity:
            self._resize(max(needed, 2 * self.capacity, self._initial_rows))
        for name, col in self._cols.items():
            col[self.size : needed] = columns[name]
        self.size = needed

    def expire(self, time_column: str, cutoff: float) -> bool:
        """Drop rows whose `time_column` is before `cutoff`; True when any went."""
        t = self.col(time_column)
        if self.size == 0 or float(t.min()) >= cutoff:
            return False
        keep = t >= cutoff
        kept = int(keep.sum())
        for col in self._cols.values():
            col[:kept] = col[: self.size][keep]
        self.size = kept
        return True

    def _resize(self, rows: int) -> None:
        for name, col in self._cols.items():
            grown = np.empty(rows, self._dtypes[name])
            grown[: self.size] = col[: self.size]
            self._cols[name] = grown


def _pod_info(ref: node.PodRef) -> _PodInfo:
    """A pod the agent knows only by uid is reported as namespace "" and name = uid."""
    name = ref.name or ref.uid
    namespace = ref.namespace if ref.name else ""
    return _PodInfo(
        namespace=namespace,
        name=name,
        uid=ref.uid,
        priority=vocab.priority_class_with_default(ref.labels, ref.priority, ref.kube_qos),
        qos=vocab.qos_class_with_default(ref.labels, ref.kube_qos),
    )


def _append_samples(table: _Table, samples: Sequence[tuple[float, ...]], names: Sequence[str]) -> None:
    if samples:
        rows = _rows(samples, len(names))
        table.append({name: rows[:, i] for i, name in enumerate(names)}, rows.shape[0])


class NodeWindow:
    """One node's recent samples, fed batch by batch (`add`) and bounded by the spec's longest window."""

    def __init__(self, spec: node.MetricCollectPolicy, *, last_report: float | None = None) -> None:
        self._horizon, self._pod_horizon = _retention_seconds(spec)
        rows = int(self._horizon) + _SERIES_SLACK_ROWS
        self._node = _Table(_SAMPLE_COLUMNS, rows)
        self._system = _Table(_SAMPLE_COLUMNS, rows)
        self._page_cache = _Table(_MEMORY_COLUMNS, rows)
        self._hot_page = _Table(_MEMORY_COLUMNS, rows)
        self._pods = _Table(_POD_COLUMNS, _POD_TABLE_INITIAL_ROWS)
        self._slot_of: dict[str, int] = {}
        self._refs: list[node.PodRef | None] = []
        self._ref_seen: list[float] = []
        self._infos: list[_PodInfo | None] = []
        self._free_slots: list[int] = []
        self._held: dict[float, float] = {}  # window_start -> window_end of batches already added
        self._newest_end: float | None = None
        self._first_start: float | None = None
        self._last_report = last_report

    # -- read side

    @property
    def newest_end(self) -> float | None:
        return self._newest_end

    @property
    def last_report(self) -> float | None:
        return self._last_report

    @property
    def first_start(self) -> float | None:
        """The earliest window_start ever added: no report round before it has any data."""
        return self._first_start

    @property
    def pods(self) -> dict[str, node.PodRef]:
        """The latest PodRef of every pod that still has samples in the window, by uid."""
        return {uid: ref for uid, slot in self._slot_of.items() if (ref := self._refs[slot]) is not None}

    def capacities(self) -> dict[str, int]:
        """Allocated rows per table (what bounds memory); for tests and the service's gauges."""
        tables = {
            "node": self._node,
            "system": self._system,
            "page_cache": self._page_cache,
            "hot_page": self._hot_page,
            "pods": self._pods,
        }
        return {name: table.capacity for name, table in tables.items()} | {"pod_slots": len(self._infos)}

    # -- write side

    def set_spec(self, spec: node.MetricCollectPolicy) -> None:
        """Adopt a new collect policy; a longer window only fills with data that arrives from now on."""
        self._horizon, self._pod_horizon = _retention_seconds(spec)

    def mark_reported(self, report_time: float) -> None:
        self._last_report = report_time if self._last_report is None else max(self._last_report, report_time)

    def rewind_report(self, last_report: float | None) -> None:
        """Go back to an earlier last report: reports computed but never published come due again."""
        self._last_report = last_report

    def add(self, batch: node.NodeMetricsReported) -> bool:
        """Take one batch; False when it was already held or is entirely older than every window kept."""
        if batch.window_start in self._held:
            return False
        newest = batch.window_end if self._newest_end is None else max(self._newest_end, batch.window_end)
        if batch.window_end <= newest - self._horizon:
            return False
        self._newest_end = newest
        self._first_start = (
            batch.window_start if self._first_start is None else min(self._first_start, batch.window_start)
        )
        self._held[batch.window_start] = batch.window_end
        _append_samples(self._node, batch.node_samples, ("t", "cpu", "mem"))
        _append_samples(self._system, batch.system_samples, ("t", "cpu", "mem"))
        _append_samples(self._page_cache, batch.memory_with_page_cache, ("t", "mem"))
        _append_samples(self._hot_page, batch.memory_with_hot_page, ("t", "mem"))
        self._add_pod_buckets(batch.pods, seen_at=batch.window_end)
        self._expire(newest)
        return True

    def _add_pod_buckets(self, all_pods: Sequence[node.PodSamples], *, seen_at: float) -> None:
        pods = [p for p in all_pods if p.samples]
        if not pods:
            return
        n = len(pods)
        slots = np.fromiter((self._slot_for(p.pod, seen_at) for p in pods), np.int64, count=n)
        lengths = np.fromiter((len(p.samples) for p in pods), np.int64, count=n)
        flat = itertools.chain.from_iterable(itertools.chain.from_iterable(p.samples for p in pods))
        rows = np.fromiter(flat, np.float64, count=3 * int(lengths.sum())).reshape(-1, 3)
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        sums = np.add.reduceat(rows, starts, axis=0)
        pc_lengths = np.fromiter((len(p.memory_with_page_cache) for p in pods), np.int64, count=n)
        pc_values = np.fromiter(
            (mem for p in pods for _, mem in p.memory_with_page_cache), np.float64, count=int(pc_lengths.sum())
        )
        pc_sums = np.bincount(np.repeat(np.arange(n), pc_lengths), weights=pc_values, minlength=n)
        columns = {
            "pod": slots,
            "count": lengths,
            "cpu_sum": sums[:, 1],
            "mem_sum": sums[:, 2],
            "pc_count": pc_lengths,
            "pc_sum": pc_sums,
            "t_min": np.minimum.reduceat(rows[:, 0], starts),
            "t_max": np.maximum.reduceat(rows[:, 0], starts),
        }
        self._pods.append(columns, n)

    def _slot_for(self, ref: node.PodRef, seen_at: float) -> int:
        """The pod's row index, allocating one for a new uid; the newest batch's PodRef wins."""
        slot = self._slot_of.get(ref.uid)
        if slot is None:
            slot = self._free_slots.pop() if self._free_slots else len(self._infos)
            if slot == len(self._infos):
                self._refs.append(None)
                self._ref_seen.append(-math.inf)
                self._infos.append(None)
            self._slot_of[ref.uid] = slot
        if seen_at >= self._ref_seen[slot]:
            self._ref_seen[slot] = seen_at
            if self._refs[slot] != ref:
                self._refs[slot] = ref
                self._infos[slot] = _pod_info(ref)
        return slot

    def _expire(self, newest: float) -> None:
        cutoff = newest - self._horizon
        for table in (self._node, self._system, self._page_cache, self._hot_page):
            table.expire("t", cutoff)
        if self._pods.expire("t_min", newest - self._pod_horizon):
            self._forget_pods_without_buckets()
        # Batches arrive in time order almost always, so the oldest are at the front of the dict.
        while self._held and next(iter(self._held.values())) <= cutoff:
            del self._held[next(iter(self._held))]

    def _forget_pods_without_buckets(self) -> None:
        used = np.zeros(len(self._infos), dtype=bool)
        used[self._pods.col("pod")] = True
        for slot in np.flatnonzero(~used).tolist():
            ref = self._refs[slot]
            if ref is None:
                continue
            del self._slot_of[ref.uid]
            self._refs[slot] = self._infos[slot] = None
            self._ref_seen[slot] = -math.inf
            self._free_slots.append(slot)

    def _sources(self, memory_policy: str) -> _Sources:
        node_t = self._node.col("t")
        node_memory = _Series(node_t, self._node.col("mem"))
        pods_memory = (self._pods.col("count"), self._pods.col("mem_sum"))
        if memory_policy == koordinator.MEMORY_WITH_PAGE_CACHE:
            node_memory = _Series(self._page_cache.col("t"), self._page_cache.col("mem"))
            pods_memory = (self._pods.col("pc_count"), self._pods.col("pc_sum"))
        elif memory_policy == koordinator.MEMORY_WITH_HOT_PAGE_CACHE and self._hot_page.size:
            # koordlet falls back to the plain series unless the cold-page collector runs; ours ran iff it reported.
            node_memory = _Series(self._hot_page.col("t"), self._hot_page.col("mem"))
        buckets = _PodBuckets(
            pod=self._pods.col("pod"),
            count=self._pods.col("count"),
            cpu_sum=self._pods.col("cpu_sum"),
            mem_count=pods_memory[0],
            mem_sum=pods_memory[1],
            t_min=self._pods.col("t_min"),
            t_max=self._pods.col("t_max"),
            infos=self._infos,
        )
        return _Sources(
            node_cpu=_Series(node_t, self._node.col("cpu")),
            node_memory=node_memory,
            system_cpu=_Series(self._system.col("t"), self._system.col("cpu")),
            system_memory=_Series(self._system.col("t"), self._system.col("mem")),
            pods=buckets,
            closed_end=False,
        )


def compute_status(window: NodeWindow, *, report_time: float, spec: node.MetricCollectPolicy) -> node.NodeMetricStatus:
    """The NodeMetric status of one report round at `report_time` (§1.6 items 1, 2, 3, 5, 8)."""
    return _status(window._sources(spec.node_memory_collect_policy), report_time=report_time, spec=spec)


def count_samples(window: NodeWindow, *, report_time: float, spec: node.MetricCollectPolicy) -> list[WindowCount]:
    """Sample counts per window of the report at `report_time`."""
    return _counts(window._sources(spec.node_memory_collect_policy), report_time=report_time, spec=spec)


def due_report(window: NodeWindow, *, spec: node.MetricCollectPolicy) -> float | None:
    """The newest report time (a multiple of the effective interval) the window has reached and not reported.

    Driven by event time, so a replay computes the same rounds; older missed rounds are skipped, not caught up,
    and no round is due at or before the first batch (its window would hold nothing).
    """
    if window.newest_end is None or window.first_start is None:
        return None
    interval = effective_policy(spec).report_interval_seconds
    due = float(math.floor(window.newest_end / interval) * interval)
    if due <= window.first_start or (window.last_report is not None and due <= window.last_report):
        return None
    return due
