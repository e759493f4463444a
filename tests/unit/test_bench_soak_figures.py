"""bench.soak_figures: the soak's durations, error lines, /metrics figures and RSS trend, from text and numbers."""

from __future__ import annotations

import json

import pytest

from bench import soak_figures as figures


def test_durations() -> None:
    assert [figures.parse_duration(t) for t in ("90s", "12m", "1.5h", "500ms", "45", " 2 m ")] == [
        90.0, 720.0, 5400.0, 0.5, 45.0, 120.0,
    ]  # fmt: skip
    for bad in ("", "m", "10d", "-5s", "1h30m"):
        with pytest.raises(ValueError, match="invalid duration"):
            figures.parse_duration(bad)


def record(level: str, message: str, **extra: str) -> str:
    return json.dumps({"time": "2026-11-26T10:00:00.000Z", "level": level, "logger": "x", "message": message, **extra})


def test_error_lines_are_json_records_at_error_or_above_and_unstructured_tracebacks() -> None:
    lines = [
        "koordbus is up.",
        record("INFO", "an ERROR word in an info message is no error"),
        record("WARNING", "slow"),
        record("ERROR", "handler failed", exception="Traceback (most recent call last):\n  ...\nKeyError: 'a'"),
        record("CRITICAL", "gone"),
        "Traceback (most recent call last):",
        "  File \"x.py\", line 1",
        "plain text saying ERROR",
    ]  # fmt: skip
    counted = figures.classify_log(lines, keep=3)
    assert (counted.errors, counted.warnings) == (4, 1)
    assert counted.first_errors == [
        "x: handler failed | KeyError: 'a'",
        "x: gone",
        "Traceback (most recent call last):",
    ]
    assert counted.first_warnings == ["x: slow"]
    assert figures.nats_log_errors(["[1] [INF] ok", "[1] [ERR] bad\n", "[1] [FTL] worse"]) == [
        "[1] [ERR] bad", "[1] [FTL] worse",
    ]  # fmt: skip


SCRAPE = """\
# TYPE koordbus_consumer_pending_messages gauge
koordbus_consumer_pending_messages{consumer="nodemetric",service="nodemetric"} 120.0
koordbus_consumer_pending_messages{consumer="quota-status",service="quota"} 0.0
# TYPE koordbus_consumer_dead_lettered_total counter
koordbus_consumer_dead_lettered_total{consumer="nodemetric",service="nodemetric"} 2.0
# TYPE koordbus_api_request_seconds histogram
koordbus_api_request_seconds_count{method="GET",route="/quotas",status="200"} 7.0
koordbus_api_request_seconds_count{method="POST",route="/quotas",status="503"} 1.0
koordbus_api_request_seconds_count{method="POST",route="/quotas",status="502"} 2.0
"""


def test_scrape_figures() -> None:
    scrape = figures.parse_scrape(SCRAPE)
    assert scrape.lag == {"nodemetric/nodemetric": 120.0, "quota/quota-status": 0.0}
    assert scrape.dead_letters == {"nodemetric/nodemetric": 2.0}
    assert scrape.server_5xx == {"POST /quotas": 3.0}


def test_rss_trend_after_the_warmup() -> None:
    mib = 2**20
    # 100 MiB growing fast during a 60 s warm-up, then 200 MiB growing by 1 MiB a minute for an hour
    samples = [(float(t), (100 + t) * mib) for t in range(0, 60, 10)]
    samples += [(60.0 + t, int((200 + t / 60) * mib)) for t in range(0, 3601, 60)]
    trend = figures.rss_trend(samples, warmup=60)
    assert (trend.start_mb, trend.peak_mb) == (100.0, 260.0)
    assert trend.after_warmup_mb == 202.0 and trend.end_mb == 258.0  # medians of the first and last five minutes
    assert trend.growth_percent_after_warmup == pytest.approx(56 / 202 * 100, abs=0.01)
    assert trend.slope_percent_per_hour == pytest.approx(60 / 202 * 100, abs=0.01)  # the warm-up's climb left out
    flat = figures.rss_trend([(float(t), 50 * mib) for t in range(10)], warmup=5)
    assert (flat.growth_percent_after_warmup, flat.slope_percent_per_hour) == (0.0, 0.0)
    with pytest.raises(ValueError):
        figures.rss_trend([], warmup=0)


def test_rss_trend_reads_a_collectors_swings_as_no_growth() -> None:
    """A flat hour whose RSS swings between 242 and 288 MiB every four minutes (nats-server, Go's collector) and
    ends at a swing's top: no growth, where the medians of five samples read +8 %."""
    mib = 2**20
    samples = [(float(t), int((242 + 46 * ((t % 240) / 240)) * mib)) for t in range(0, 4201, 5)]
    samples[-5:] = [(t, 288 * mib) for t, _ in samples[-5:]]
    trend = figures.rss_trend(samples, warmup=600)
    assert abs(trend.growth_percent_after_warmup) < 2.0, trend


def test_target() -> None:
    assert figures.misses(growth_percent=4.9, http_5xx=0, error_lines=0) == []
    assert figures.misses(growth_percent=5.0, http_5xx=2, error_lines=1) == [
        "RSS grew 5.0 % after the warm-up (>= 5 %)", "2 answers with status 5xx", "1 error lines in the log",
    ]  # fmt: skip


def test_exception_summary_is_the_type_and_message_line() -> None:
    sqlalchemy = (
        "Traceback (most recent call last):\n  File \"a.py\", line 1, in f\n    g()\n"
        "sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) database is locked\n[SQL: BEGIN IMMEDIATE]\n"
        "(Background on this error at: https://sqlalche.me/e/21/e3q8)"
    )  # fmt: skip
    assert figures.exception_summary(sqlalchemy) == (
        "sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) database is locked"
    )
    assert figures.exception_summary("KeyError: 'a'") == "KeyError: 'a'"
    assert figures.exception_summary("") == ""


def test_a_backlog_settles_when_it_stays_drained() -> None:
    series = [(0.0, 5000.0), (10.0, 900.0), (20.0, 1200.0), (30.0, 40.0), (40.0, 0.0), (50.0, 1000.0)]
    assert figures.settled_at(series, limit=1000) == 30.0
    assert figures.settled_at([*series, (60.0, 1001.0)], limit=1000) is None
    assert figures.settled_at([], limit=1000) is None
