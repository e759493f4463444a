"""The soak benchmark's figures, computed from what bench/soak.py collected: durations given on the command line,
log lines that count as errors, the consumer lag and dead letters in a /metrics scrape, RSS trends over time.

Pure (text and numbers in, numbers out); used by bench/soak.py and tests/e2e/test_bench_soak_smoke.py.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

LAG_METRIC = "koordbus_consumer_pending_messages"
DEAD_LETTERS_METRIC = "koordbus_consumer_dead_lettered_total"
REQUESTS_METRIC = "koordbus_api_request_seconds_count"
ERROR_LEVELS = frozenset({"ERROR", "CRITICAL"})
EDGE_SECONDS = 300.0
"""RSS at the start of the measured period and at its end: the median of the samples of its first and its last five
minutes. One sample is noisy, and nats-server's RSS (Go's collector) swings by 40 MB over a few minutes: a median of
five samples (25 s) read one swing's top at the end of a flat hour as 5 % growth (the soak of 2026-11-27)."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNSTRUCTURED_ERROR = re.compile(r"Traceback \(most recent call last\)|\b(ERROR|CRITICAL)\b")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds in `90s`, `12m`, `1.5h`, `500ms` or a bare number of seconds; ValueError otherwise."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"invalid duration {text!r}: give a number with s, m or h, e.g. 90s, 12m, 1h")
    return float(match.group(1)) * _SECONDS[match.group(2) or "s"]


@dataclass
class LogLines:
    """What a process's log holds that matters for a soak: its error lines and warnings (with the first few)."""

    errors: int = 0
    warnings: int = 0
    first_errors: list[str] = field(default_factory=list)
    first_warnings: list[str] = field(default_factory=list)


def classify_log(lines: Iterable[str], *, keep: int = 5) -> LogLines:
    """Count `koordbus --log-format json` records at level ERROR/CRITICAL (and WARNING); a line that is not such a
    record (a banner, something printed around the logger) counts as an error when it holds a traceback or says
    ERROR/CRITICAL."""
    out = LogLines()
    for raw in lines:
        line = raw.rstrip("\n")
        level = ""
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict) and "level" in record:
            level = str(record["level"])
            shown = f"{record.get('logger', '')}: {record.get('message', '')}"
            if "exception" in record:
                shown += " | " + exception_summary(str(record["exception"]))
        else:
            level = "ERROR" if _UNSTRUCTURED_ERROR.search(line) else ""
            shown = line
        if level in ERROR_LEVELS:
            out.errors += 1
            if len(out.first_errors) < keep:
                out.first_errors.append(shown[:500])
        elif level == "WARNING":
            out.warnings += 1
            if len(out.first_warnings) < keep:
                out.first_warnings.append(shown[:500])
    return out


def exception_summary(text: str) -> str:
    """The `Type: message` line of a formatted exception: the first line after its last indented traceback line."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    frames = [i for i, line in enumerate(lines) if line.startswith(" ")]
    after = frames[-1] + 1 if frames else 0
    return lines[after] if after < len(lines) else lines[-1] if lines else ""


def nats_log_errors(lines: Iterable[str]) -> list[str]:
    """nats-server's `[ERR]` and `[FTL]` lines."""
    return [line.rstrip("\n") for line in lines if "[ERR]" in line or "[FTL]" in line]


@dataclass(frozen=True)
class Scrape:
    """The figures of one /metrics scrape of `koordbus up` that a soak watches."""

    lag: dict[str, float]
    """Consumer lag (messages yet to be delivered) per `service/consumer`."""
    dead_letters: dict[str, float]
    """Messages dead-lettered so far per `service/consumer`."""
    server_5xx: dict[str, float]
    """5xx answers so far per `METHOD route`, as the API counted them."""


def parse_scrape(text: str) -> Scrape:
    lag: dict[str, float] = {}
    dead: dict[str, float] = {}
    errors: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == LAG_METRIC:
                lag[f"{labels['service']}/{labels['consumer']}"] = float(sample.value)
            elif sample.name == DEAD_LETTERS_METRIC:
                dead[f"{labels['service']}/{labels['consumer']}"] = float(sample.value)
            elif sample.name == REQUESTS_METRIC and labels.get("status", "").startswith("5"):
                key = f"{labels['method']} {labels['route']}"
                errors[key] = errors.get(key, 0.0) + float(sample.value)
    return Scrape(lag=lag, dead_letters=dead, server_5xx=errors)


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of y over x (0 for fewer than two distinct x)."""
    if len(points) < 2:
        return 0.0
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


@dataclass(frozen=True, kw_only=True)
class RssTrend:
    """One process's (or the tree's) resident set over a soak, in MiB; the percentages relate to `after_warmup`."""

    start_mb: float
    after_warmup_mb: float
    end_mb: float
    peak_mb: float
    growth_percent_after_warmup: float
    slope_percent_per_hour: float


def rss_trend(samples: Sequence[tuple[float, int]], *, warmup: float) -> RssTrend:
    """From (seconds since the start, RSS bytes) samples in time order: the start, the level once warm (the median
    of the samples of the first EDGE_SECONDS at or after `warmup`) and at the end (the median of the last
    EDGE_SECONDS), the growth between those two, and the least-squares slope over every sample after the warm-up, per
    hour."""
    if not samples:
        raise ValueError("no RSS samples")
    warm = [(t, rss) for t, rss in samples if t >= warmup] or list(samples[-1:])
    first, last = warm[0][0], warm[-1][0]
    after = statistics.median(rss for t, rss in warm if t < first + EDGE_SECONDS)
    end = statistics.median(rss for t, rss in warm if t > last - EDGE_SECONDS)
    per_second = slope([(t, float(rss)) for t, rss in warm])
    mib = 2**20
    return RssTrend(
        start_mb=round(samples[0][1] / mib, 1),
        after_warmup_mb=round(after / mib, 1),
        end_mb=round(end / mib, 1),
        peak_mb=round(max(rss for _, rss in samples) / mib, 1),
        growth_percent_after_warmup=round((end - after) / after * 100, 2) if after else 0.0,
        slope_percent_per_hour=round(per_second * 3600 / after * 100, 2) if after else 0.0,
    )


def settled_at(series: Sequence[tuple[float, float]], *, limit: float) -> float | None:
    """The time of the first (time, value) sample from which every later value stays at or below `limit` (a backlog
    drained for good); None when the last one is above it."""
    settled = None
    for at, value in series:
        if value > limit:
            settled = None
        elif settled is None:
            settled = at
    return settled


@dataclass(frozen=True)
class Target:
    """The issue's target for a soak: RSS growth under 5 % after the warm-up, no 5xx, no error lines."""

    rss_growth_percent: float = 5.0


def misses(*, growth_percent: float, http_5xx: int, error_lines: int, target: Target = Target()) -> list[str]:
    """Why the target was not held; empty when it was."""
    out = []
    if growth_percent >= target.rss_growth_percent:
        out.append(f"RSS grew {growth_percent:.1f} % after the warm-up (>= {target.rss_growth_percent:g} %)")
    if http_5xx:
        out.append(f"{http_5xx} answers with status 5xx")
    if error_lines:
        out.append(f"{error_lines} error lines in the log")
    return out
