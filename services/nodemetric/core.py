"""Pure NodeMetric status assembly (spec §1.6) from window inputs, and the calc path over raw samples.

Callers: services.nodemetric.window builds `Sources` from a node's streaming window and calls
`assemble_status`; `koordbus calc nodemetric` calls `compute_from_samples`. Aggregations live in
services.nodemetric.aggregate. Time is always a parameter: report times are derived from event time (multiples
of the report interval), so replaying a stream yields identical reports.

Windows. The calc path queries [T − w, T] like Koordinator's TSDB; the streaming path queries [T − w, T) (see
services.nodemetric.window for why). Pod samples enter as buckets (count, sums, first and last sample time): a
bucket counts toward a window iff start ≤ t_min and t_max is before the end. `compute_from_samples` uses one
bucket per sample, so the calc path is always exact.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from schemas import node
from schemas.resources import CPU, MEMORY
from services.nodemetric import aggregate
from services.nodemetric.aggregate import AVG, STATUS_AGGREGATIONS, FloatArray

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


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    priority: str
    qos: str


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


@dataclass(frozen=True)
class Sources:
    node_cpu: Series
    node_memory: Series
    system_cpu: Series
    system_memory: Series
    pods: PodBuckets
    closed_end: bool  # calc queries [start, end] like Koordinator; the stream [start, end), see the docstring

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


def _usage_maps(
    cpu: Series, memory: Series, span: Span, *, kinds: Sequence[str], min_span: float
) -> dict[str, node.ResourceMap]:
    """One ResourceMap per aggregation kind; all empty when a query has no samples or the CPU span is too short."""
    cpu_w, mem_w = cpu.within(span), memory.within(span)
    if cpu_w.t.size == 0 or mem_w.t.size == 0 or float(cpu_w.t.max() - cpu_w.t.min()) < min_span:
        return {kind: node.ResourceMap() for kind in kinds}
    cpu_agg, mem_agg = aggregate.status_aggregates(cpu_w.v), aggregate.status_aggregates(mem_w.v)
    return {
        kind: node.ResourceMap(resources={CPU: _millicores(cpu_agg[kind]), MEMORY: int(mem_agg[kind])})
        for kind in kinds
    }


def _average(cpu: Series, memory: Series, span: Span) -> node.ResourceMap:
    """nodeUsage / systemUsage: the avg with no cold-start filter."""
    return _usage_maps(cpu, memory, span, kinds=(AVG,), min_span=-math.inf)[AVG]


def _aggregated(
    sources: Sources, cpu: Series, memory: Series, *, end: float, durations: Iterable[int]
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


def _pod_metrics(buckets: PodBuckets, span: Span) -> list[node.PodMetric]:
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


def assemble_status(sources: Sources, *, report_time: float, spec: node.MetricCollectPolicy) -> node.NodeMetricStatus:
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
