"""What the ingest benchmark reads off the service and how it judges the run: Prometheus text, /proc, the verdict.

Called by bench/nodemetric_ingest.py at the start and the end of the measured period (summing its replicas'
scrapes with `sum_metrics`), and by the smoke tests.
The parsers and `histogram_quantile` are pure (text in, numbers out); only `read_proc` touches the filesystem.
Latency quantiles follow Prometheus' histogram_quantile: linear interpolation inside the bucket the rank falls
in, the first bucket starting at 0, and a rank in the +Inf bucket answered with the highest finite bound.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

BATCHES = "koordbus_nodemetric_batches_total"
REPORTS = "koordbus_nodemetric_reports_total"
OWNED_PARTITIONS = "koordbus_nodemetric_owned_partitions"
LATENCY = "koordbus_nodemetric_ingest_latency_seconds"
PROJECTION_LATENCY = "koordbus_nodemetric_projection_latency_seconds"

Buckets = tuple[tuple[float, float], ...]
"""Cumulative histogram buckets as (upper bound `le`, count), ascending, +Inf last."""


@dataclass(frozen=True)
class ServiceMetrics:
    """The counters and the latency histogram of one /metrics scrape."""

    batches: float
    reports: float
    latency: Buckets
    projection_latency: Buckets
    """Agent send → NodeMetric row committed, per report."""
    owned_partitions: float = 0.0
    """Node partitions the replica ingests (all of them without an instance name)."""


def sum_metrics(scrapes: list[ServiceMetrics]) -> ServiceMetrics:
    """The figures of several replicas as one service's: counters and histogram buckets added up."""

    def buckets(each: list[Buckets]) -> Buckets:
        bounds = [le for le, _ in each[0]]
        if any([le for le, _ in b] != bounds for b in each):
            raise ValueError("the replicas' histograms have different buckets")
        return tuple((le, sum(b[i][1] for b in each)) for i, le in enumerate(bounds))

    return ServiceMetrics(
        batches=sum(m.batches for m in scrapes),
        reports=sum(m.reports for m in scrapes),
        latency=buckets([m.latency for m in scrapes]),
        projection_latency=buckets([m.projection_latency for m in scrapes]),
        owned_partitions=sum(m.owned_partitions for m in scrapes),
    )


def parse_metrics(text: str) -> ServiceMetrics:
    """Pick the nodemetric service's figures out of a Prometheus text exposition."""
    values: dict[str, float] = {}
    buckets: list[tuple[float, float]] = []
    projection: list[tuple[float, float]] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{LATENCY}_bucket":
                buckets.append((float(sample.labels["le"]), float(sample.value)))
            elif sample.name == f"{PROJECTION_LATENCY}_bucket":
                projection.append((float(sample.labels["le"]), float(sample.value)))
            elif not sample.labels:
                values[sample.name] = float(sample.value)
    missing = [name for name in (BATCHES, REPORTS) if name not in values]
    if missing or not buckets:
        raise ValueError(f"/metrics lacks {', '.join(missing or [LATENCY])}: is this the nodemetric service?")
    return ServiceMetrics(
        batches=values[BATCHES],
        reports=values[REPORTS],
        latency=tuple(sorted(buckets)),
        projection_latency=tuple(sorted(projection)),
        owned_partitions=values.get(OWNED_PARTITIONS, 0.0),
    )


def bucket_deltas(after: Buckets, before: Buckets) -> Buckets:
    """Observations made between two scrapes of the same histogram."""
    if [le for le, _ in after] != [le for le, _ in before]:
        raise ValueError("histogram buckets changed between scrapes (service restarted?)")
    return tuple((le, a - b) for (le, a), (_, b) in zip(after, before, strict=True))


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """The q-quantile of cumulative `buckets`, or None when they hold no observation."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    if not buckets or not math.isinf(buckets[-1][0]):
        raise ValueError("a histogram needs its +Inf bucket")
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for upper_bound, count in buckets:
        if count >= rank:
            if math.isinf(upper_bound):
                return lower_bound  # past every finite bound: the best Prometheus can say
            in_bucket = count - lower_count
            if in_bucket <= 0:
                return upper_bound
            return lower_bound + (upper_bound - lower_bound) * (rank - lower_count) / in_bucket
        lower_bound, lower_count = upper_bound, count
    raise AssertionError("unreachable: the +Inf bucket holds the total")


def fraction_above_top_bucket(buckets: Buckets) -> float:
    """Share of observations beyond the highest finite bound, where a quantile can only say "at least this"."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0 or len(buckets) < 2:
        return 0.0
    return (total - buckets[-2][1]) / total


@dataclass(frozen=True)
class ProcSample:
    """A process's CPU time so far (user + system, all threads) and its peak and current resident set."""

    cpu_seconds: float
    rss_peak_bytes: int
    rss_bytes: int


def parse_proc(stat: str, status: str, *, clock_ticks: int) -> ProcSample:
    """From the text of /proc/<pid>/stat and /proc/<pid>/status."""
    # The command name (field 2) may contain spaces and parentheses: count fields after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    kib = {}
    for line in status.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            kib[key] = int(rest.split()[0])
    return ProcSample(
        cpu_seconds=(utime + stime) / clock_ticks,
        rss_peak_bytes=kib.get("VmHWM", 0) * 1024,
        rss_bytes=kib.get("VmRSS", 0) * 1024,
    )


def read_proc(pid: int) -> ProcSample:
    with open(f"/proc/{pid}/stat") as stat, open(f"/proc/{pid}/status") as status:
        return parse_proc(stat.read(), status.read(), clock_ticks=os.sysconf("SC_CLK_TCK"))


@dataclass(frozen=True)
class Target:
    """The issue's target: p99 under 2 s, under 2 GB resident, the offered rate sent and applied, no growing backlog."""

    p99_seconds: float = 2.0
    rss_bytes: int = 2 * 1024**3
    rate_tolerance: float = 0.03
    """Achieved may fall this fraction short of offered (batches straddling the period's edges)."""
    backlog_seconds: float = 2.0
    """A backlog at the end worth more than this much of the offered rate, and larger than at the start, is growing."""


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """The measured period's figures that the verdict depends on."""

    offered_per_s: float
    published_per_s: float
    applied_per_s: float
    latency_p99_s: float | None
    projection_latency_p99_s: float | None = None
    rss_peak_bytes: int
    backlog_start: int
    backlog_end: int
    publish_errors: int


def misses(outcome: Outcome, target: Target = Target()) -> list[str]:
    """Why the target was not held; empty when it was."""
    out: list[str] = []
    floor = outcome.offered_per_s * (1 - target.rate_tolerance)
    if outcome.published_per_s < floor:
        out.append(f"generator sent {outcome.published_per_s:.1f}/s of {outcome.offered_per_s:.1f}/s offered")
    if outcome.applied_per_s < floor:
        out.append(f"service applied {outcome.applied_per_s:.1f}/s of {outcome.offered_per_s:.1f}/s offered")
    if outcome.publish_errors:
        out.append(f"{outcome.publish_errors} publishes failed")
    if outcome.latency_p99_s is None:
        out.append("no batch was applied in the measured period")
    elif outcome.latency_p99_s >= target.p99_seconds:
        out.append(f"p99 {outcome.latency_p99_s:.3f} s >= {target.p99_seconds} s")
    if outcome.projection_latency_p99_s is not None and outcome.projection_latency_p99_s >= target.p99_seconds:
        out.append(f"projection p99 {outcome.projection_latency_p99_s:.3f} s >= {target.p99_seconds} s")
    if outcome.rss_peak_bytes >= target.rss_bytes:
        out.append(f"peak RSS {outcome.rss_peak_bytes / 2**20:.0f} MiB >= {target.rss_bytes / 2**20:.0f} MiB")
    allowed = max(outcome.backlog_start, outcome.offered_per_s * target.backlog_seconds)
    if outcome.backlog_end > allowed:
        out.append(f"backlog grew from {outcome.backlog_start} to {outcome.backlog_end} messages")
    return out


def rate(after: float, before: float, seconds: float) -> float:
    return (after - before) / seconds if seconds > 0 else 0.0


def quantile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank q-quantile of `values` (None when there are none)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]
