"""Pure NodeMetric status assembly (spec §1.6) from window inputs, and the calc path over raw samples.

Callers: services.nodemetric.window builds `Sources` from a node's streaming window and calls
`assemble_status`; `koordbus calc nodemetric` calls `compute_from_samples`. Aggregations live in
services.nodemetric.aggregate. Time is always a parameter: report times are derived from event time (multiples
of the report interval), so replaying a stream yields identical reports.

Windows. The calc path queries [T − w, T] like Koordinator's TSDB; the streaming path queries [T − w, T) (see
services.nodemetric.window for why). Pod and host application samples enter as buckets (count, sums, first and last
sample time): a bucket counts toward a window iff start ≤ t_min and t_max is before the end. `compute_from_samples`
uses one bucket per sample, so the calc path is always exact.
"""

from __future__ import annotations

import hashlib
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt

from schemas import node
from schemas.resources import CPU, MEMORY
from services.nodemetric import aggregate
from services.nodemetric.aggregate import STATUS_AGGREGATIONS, FloatArray

MIN_REPORT_INTERVAL_SECONDS = 30
MIN_AGGREGATE_WINDOW_SECONDS = 60
COLD_START_RATIO = 0.5


# --- policy


def effective_policy(spec: node.MetricCollectPolicy) -> node.MetricCollectPolicy:
    """koordlet's floors (§1.3): reports at least 30 s apart, averages over at least 60 s."""
    return node.MetricCollectPolicy(
        aggregate_duration_seconds=max(spec.aggregate_duration_seconds, MIN_AGGREGATE_WINDOW_SECONDS),
        report_interval_seconds=max(spec.report_interval_seconds, MIN_REPORT_INTERVAL_SECONDS),
        durations_seconds=spec.durations_seconds,
        node_memory_collect_policy=spec.node_memory_collect_policy,
    )


def report_phase(node_name: str, *, interval: int, step: int) -> int:
    """Seconds past each multiple of the report interval at which this node reports.

    koordlet reports on its own timer, so a real cluster's reports are spread out; ours are driven by event time,
    and without a phase every node would report in the same instant. The phase is a stable hash of the node name
    into `step`-second slots (step = the agents' batch length, so reports still fall on batch boundaries and pod
    averages stay exact). It is 0 when step does not divide the interval.
    """
    if step <= 0 or interval % step:
        return 0
    digest = hashlib.blake2b(node_name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (interval // step) * step


def retention_seconds(spec: node.MetricCollectPolicy) -> tuple[float, float]:
    """(raw-sample horizon, pod-bucket horizon): a window plus one report interval of lag behind the newest batch."""
    eff = effective_policy(spec)
    longest = max((eff.aggregate_duration_seconds, *eff.durations_seconds))
    return float(longest + eff.report_interval_seconds), float(
        eff.aggregate_duration_seconds + eff.report_interval_seconds
    )


# --- the window inputs, shared by the streaming and the calc path


@dataclass(frozen=True)
class Span:
    """A query window [start, end], or [start, end) on the streaming path (see the module docstring)."""

    start: float
    end: float
    closed: bool

    def mask(self, t_first: FloatArray, t_last: FloatArray) -> npt.NDArray[np.bool_]:
        before_end = t_last <= self.end if self.closed else t_last < self.end
        return (t_first >= self.start) & before_end


@dataclass(frozen=True)
class Series:
    t: FloatArray
    v: FloatArray

    def within(self, span: Span) -> Series:
        mask = span.mask(self.t, self.t)
        return Series(self.t[mask], self.v[mask])


class PodInfo(msgspec.Struct, frozen=True, gc=False):
    """What a report says of a pod besides its usage. Not tracked by the garbage collector: the service holds
    one per pod of every node (a million at 10,000 nodes), and full collections walking them stalled ingest."""

    namespace: str
    name: str
    uid: str
    priority: str
    qos: str
    cpu_request: int = 0
    """The pod's request (cpu millicores, memory bytes), creation time and whether it is terminating or finished:
    what the prod predictor reads (services.nodemetric.training)."""
    memory_request: int = 0
    created_at: float | None = None
    terminating: bool = False


@dataclass(frozen=True)
class PodBuckets:
    """Columns of one row per (pod, bucket); `pod` indexes `infos` (None marks a free slot)."""

    pod: npt.NDArray[np.int64]
    count: FloatArray
    cpu_sum: FloatArray
    mem_count: FloatArray
    mem_sum: FloatArray
    t_min: FloatArray
    t_max: FloatArray
    infos: Sequence[PodInfo | None]


class HostAppInfo(msgspec.Struct, frozen=True, gc=False):
    """A host application's name and the classes its NodeSLO entry gives it, as the newest batch said."""

    name: str
    priority: str = ""
    qos: str = ""


@dataclass(frozen=True)
class HostAppBuckets:
    """PodBuckets' columns for host applications; `app` indexes `infos` (None marks a free slot)."""

    app: npt.NDArray[np.int64]
    count: FloatArray
    cpu_sum: FloatArray
    mem_count: FloatArray
    mem_sum: FloatArray
    t_min: FloatArray
    t_max: FloatArray
    infos: Sequence[HostAppInfo | None]


@dataclass(frozen=True)
class Sources:
    node_cpu: Series
    node_memory: Series
    system_cpu: Series
    system_memory: Series
    pods: PodBuckets
    closed_end: bool  # calc queries [start, end] like Koordinator; the stream [start, end), see the docstring
    host_apps: HostAppBuckets | None = None

    def span(self, end: float, duration: float) -> Span:
        return Span(end - duration, end, self.closed_end)


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


_Selection = slice | npt.NDArray[np.bool_]


class _Windows:
    """Where the windows of one report, [start, end] (or [start, end)) for each start, lie in each time array.

    Batches almost always arrive in time order, so a time array is usually non-decreasing (checked once per status):
    its windows are then slices found by binary search, and their samples views rather than copies. An
    out-of-order batch (appended at the end) or unsorted calc input falls back to masks, which pick the same
    samples in the same order. Series usually share their times (one array, or equal ones), located only once.
    """

    def __init__(self, starts: Sequence[float], *, end: float, closed: bool) -> None:
        self._starts, self._end, self._closed = starts, end, closed
        self._located: list[tuple[FloatArray, list[_Selection]]] = []

    def of(self, t: FloatArray) -> list[_Selection]:
        """One selection of `t` per start."""
        for known, selections in self._located:
            if known is t or (known.shape == t.shape and bool((known == t).all())):
                return selections
        selections = self._locate(t)
        self._located.append((t, selections))
        return selections

    def _locate(self, t: FloatArray) -> list[_Selection]:
        # NaN compares False, so a NaN among the times sends them to the masks (a lone one matches nothing either
        # way); a NaN bound, which matches nothing in a mask but sorts last for a binary search, does too.
        in_order = bool((t[1:] >= t[:-1]).all())
        if not in_order or math.isnan(self._end) or any(map(math.isnan, self._starts)):
            return [Span(start, self._end, self._closed).mask(t, t) for start in self._starts]
        firsts = t.searchsorted(self._starts, side="left").tolist()
        stop = int(t.searchsorted(self._end, side="right" if self._closed else "left"))
        return [slice(first, stop) for first in firsts]


def _spread(t: FloatArray, selection: _Selection) -> float:
    """Seconds from the earliest to the latest selected time; the selection must not be empty."""
    if isinstance(selection, slice):  # in order: the ends are the extremes
        return float(t.item(selection.stop - 1) - t.item(selection.start))
    chosen = t[selection]
    return float(chosen.max() - chosen.min())


def _resource_map(cores: float, memory: float) -> node.ResourceMap:
    return node.ResourceMap(resources={CPU: _millicores(cores), MEMORY: int(memory)})


class _WindowStats(NamedTuple):
    """aggregate.status_values of a window's CPU and memory samples: avg, p50, p90, p95, p99 each."""

    cpu: list[float]
    memory: list[float]


def _status_maps(stats: _WindowStats | None) -> dict[str, node.ResourceMap]:
    """One ResourceMap per status aggregation; all empty without stats."""
    if stats is None:
        return {kind: node.ResourceMap() for kind in STATUS_AGGREGATIONS}
    return {
        kind: _resource_map(cores, memory)
        for kind, cores, memory in zip(STATUS_AGGREGATIONS, stats.cpu, stats.memory, strict=True)
    }


def _usages(
    cpu: Series, memory: Series, windows: _Windows, *, aggregate_seconds: int, durations: Sequence[int]
) -> tuple[node.ResourceMap, list[node.AggregatedUsage]]:
    """nodeUsage and aggregatedNodeUsages (or the system's) from one CPU and one memory series.

    `windows` holds the aggregate window, then one per duration. A duration window whose CPU samples span less
    than half of it stays empty (cold start); the usage has no such filter, and when its window is also a
    duration's (300 s both by default) it reuses that window's average.
    """
    cpu_windows, memory_windows = windows.of(cpu.t), windows.of(memory.t)
    stats: list[_WindowStats | None] = []  # per duration; None for a window that stays empty
    for d, cpu_window, memory_window in zip(durations, cpu_windows[1:], memory_windows[1:], strict=True):
        cpu_values, memory_values = cpu.v[cpu_window], memory.v[memory_window]
        if cpu_values.size == 0 or memory_values.size == 0 or _spread(cpu.t, cpu_window) < COLD_START_RATIO * d:
            stats.append(None)
        else:
            stats.append(_WindowStats(aggregate.status_values(cpu_values), aggregate.status_values(memory_values)))

    averages = {d: (s.cpu[0], s.memory[0]) for d, s in zip(durations, stats, strict=True) if s is not None}
    if aggregate_seconds in averages:
        usage = _resource_map(*averages[aggregate_seconds])
    else:
        cpu_values, memory_values = cpu.v[cpu_windows[0]], memory.v[memory_windows[0]]
        empty = cpu_values.size == 0 or memory_values.size == 0
        usage = node.ResourceMap() if empty else _resource_map(aggregate.avg(cpu_values), aggregate.avg(memory_values))
    aggregated = [
        node.AggregatedUsage(duration_seconds=d, usage=_status_maps(s)) for d, s in zip(durations, stats, strict=True)
    ]
    return usage, aggregated


_INT64_BOUND = 2.0**63


def _truncated(values: FloatArray) -> list[int]:
    """int(v) of each value, as Python ints; in one numpy cast when every value fits in an int64."""
    if (np.abs(values) < _INT64_BOUND).all():  # False for NaN and ±inf, which int() rejects below as before
        truncated: list[int] = values.astype(np.int64).tolist()  # the cast truncates toward zero, as int() does
        return truncated
    return [int(v) for v in values.tolist()]


_BY_NAMESPACE, _BY_NAME = operator.attrgetter("namespace"), operator.attrgetter("name")


def _rows_inside(buckets: PodBuckets | HostAppBuckets, span: Span) -> _Selection:
    """The buckets inside the window: a slice when they are adjacent, as batches arriving in order leave them."""
    inside = span.mask(buckets.t_min, buckets.t_max)
    count = int(np.count_nonzero(inside))
    if count == 0:
        return slice(0, 0)
    first = int(inside.argmax())
    return slice(first, first + count) if inside[first : first + count].all() else inside


def _averages(
    buckets: PodBuckets | HostAppBuckets, slots: npt.NDArray[np.int64], span: Span
) -> tuple[list[int], list[int], list[int]]:
    """(slots, cpu millicores, memory bytes) of every slot with CPU and memory samples in the window: the averages
    over the buckets inside it."""
    rows = _rows_inside(buckets, span)
    idx = slots[rows]
    size = len(buckets.infos)
    counts = np.bincount(idx, weights=buckets.count[rows], minlength=size)
    cpu = np.bincount(idx, weights=buckets.cpu_sum[rows], minlength=size)
    mem_counts = np.bincount(idx, weights=buckets.mem_count[rows], minlength=size)
    mem = np.bincount(idx, weights=buckets.mem_sum[rows], minlength=size)
    reported = np.flatnonzero((counts > 0) & (mem_counts > 0))
    # numpy divides and multiplies float64 as Python does (IEEE), so these are `_millicores(cpu / count)` and
    # `int(mem / mem_count)` per slot, bit for bit.
    cpu_millicores = _truncated(cpu[reported] / counts[reported] * 1000)
    memory_bytes = _truncated(mem[reported] / mem_counts[reported])
    return reported.tolist(), cpu_millicores, memory_bytes


def _pod_metrics(buckets: PodBuckets, span: Span) -> list[node.PodMetric]:
    reported, cpu_millicores, memory_bytes = _averages(buckets, buckets.pod, span)
    metrics = [
        node.PodMetric(
            namespace=info.namespace,
            name=info.name,
            uid=info.uid,
            pod_usage=node.ResourceMap(resources={CPU: millicores, MEMORY: memory}),
            priority=info.priority,
            qos=info.qos,
        )
        for i, millicores, memory in zip(reported, cpu_millicores, memory_bytes, strict=True)
        if (info := buckets.infos[i]) is not None
    ]
    # By (namespace, name), ties in slot order: two stable sorts on plain string keys beat one on tuples.
    metrics.sort(key=_BY_NAME)
    metrics.sort(key=_BY_NAMESPACE)
    return metrics


def _host_app_metrics(buckets: HostAppBuckets | None, span: Span) -> list[node.HostApplicationMetric]:
    """hostApplicationMetric (§1.6 item 6): every host application with samples in the window, averaged as a pod's
    (memory per the collect policy: the window put the policy's variant into the buckets), sorted by name."""
    if buckets is None:
        return []
    reported, cpu_millicores, memory_bytes = _averages(buckets, buckets.app, span)
    metrics = [
        node.HostApplicationMetric(
            name=info.name,
            usage=node.ResourceMap(resources={CPU: millicores, MEMORY: memory}),
            priority=info.priority,
            qos=info.qos,
        )
        for i, millicores, memory in zip(reported, cpu_millicores, memory_bytes, strict=True)
        if (info := buckets.infos[i]) is not None
    ]
    metrics.sort(key=_BY_NAME)
    return metrics


def assemble_status(sources: Sources, *, report_time: float, spec: node.MetricCollectPolicy) -> node.NodeMetricStatus:
    eff = effective_policy(spec)
    aggregate_seconds, durations = eff.aggregate_duration_seconds, eff.durations_seconds
    # The aggregate window, then one per duration, all ending at the report time (as Sources.span builds them).
    starts = [report_time - seconds for seconds in (aggregate_seconds, *durations)]
    windows = _Windows(starts, end=report_time, closed=sources.closed_end)
    node_usage, aggregated_node_usages = _usages(
        sources.node_cpu, sources.node_memory, windows, aggregate_seconds=aggregate_seconds, durations=durations
    )
    system_usage, aggregated_system_usages = _usages(
        sources.system_cpu, sources.system_memory, windows, aggregate_seconds=aggregate_seconds, durations=durations
    )
    info = node.NodeMetricInfo(
        node_usage=node_usage,
        aggregated_node_usages=aggregated_node_usages,
        system_usage=system_usage,
        aggregated_system_usages=aggregated_system_usages,
    )
    aggregate_window = sources.span(report_time, aggregate_seconds)
    return node.NodeMetricStatus(
        update_time=report_time,
        node_metric=info,
        pods_metric=_pod_metrics(sources.pods, aggregate_window),
        host_applications=_host_app_metrics(sources.host_apps, aggregate_window),
    )


def count_windows(sources: Sources, *, report_time: float, spec: node.MetricCollectPolicy) -> list[WindowCount]:
    eff = effective_policy(spec)
    aggregate_window = sources.span(report_time, eff.aggregate_duration_seconds)
    pods = sources.pods
    pod_samples = int(pods.count[aggregate_window.mask(pods.t_min, pods.t_max)].sum())
    out = [_count_window(sources, eff.aggregate_duration_seconds, report_time, pod_samples)]
    out.extend(_count_window(sources, d, report_time, None) for d in eff.durations_seconds)
    return out


def _count_window(sources: Sources, duration: int, end: float, pod_samples: int | None) -> WindowCount:
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


def sample_rows(samples: Sequence[Sequence[float]], width: int) -> FloatArray:
    return np.asarray(samples, dtype=np.float64).reshape(-1, width)


def _samples_sources(
    node_samples: Sequence[tuple[float, float, float]],
    system_samples: Sequence[tuple[float, float, float]],
    pods: Sequence[PodSeries],
) -> Sources:
    nodes, system = sample_rows(node_samples, 3), sample_rows(system_samples, 3)
    per_pod = [sample_rows(p.samples, 3) for p in pods]
    rows = np.concatenate([*per_pod, np.empty((0, 3))])
    ones = np.ones(rows.shape[0])
    buckets = PodBuckets(
        pod=np.repeat(np.arange(len(pods), dtype=np.int64), [r.shape[0] for r in per_pod]),
        count=ones,
        cpu_sum=rows[:, 1],
        mem_count=ones,
        mem_sum=rows[:, 2],
        t_min=rows[:, 0],
        t_max=rows[:, 0],
        infos=[PodInfo(p.namespace, p.name, "", p.priority, p.qos) for p in pods],
    )
    return Sources(
        node_cpu=Series(nodes[:, 0], nodes[:, 1]),
        node_memory=Series(nodes[:, 0], nodes[:, 2]),
        system_cpu=Series(system[:, 0], system[:, 1]),
        system_memory=Series(system[:, 0], system[:, 2]),
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
    return assemble_status(sources, report_time=report_time, spec=spec)


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
    return count_windows(sources, report_time=report_time, spec=spec)
