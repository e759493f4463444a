"""The writers' once-a-minute INFO summary (services.k8s.instruments.WriteSummary): per-object writes stay at DEBUG,
an operator reads one line per writer per minute with every outcome counted and the failures always named."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from services.k8s.instruments import WriteSummary, summary_line


def test_the_line_counts_every_outcome_biggest_first_and_always_the_failures() -> None:
    tally = Counter({("nodemetric", "updated"): 50, ("node", "updated"): 12, ("node", "failed"): 2})
    assert summary_line("k8s writer", 60.4, tally) == (
        "k8s writer, last 60 s: 50 nodemetric updated, 12 node updated, 2 node failed, 2 failed"
    )
    assert summary_line("k8s writer", 61, Counter({("nodeslo", "rejected"): 1})) == (
        "k8s writer, last 61 s: 1 nodeslo rejected, 1 failed"
    )
    assert summary_line("w", 60, Counter()) == "w, last 60 s: nothing written, 0 failed"


def test_one_summary_per_minute_and_the_counts_start_again(caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    logger = logging.getLogger("test.write_summary")
    summary = WriteSummary("k8s writer", logger, every=60, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="test.write_summary"):
        for _ in range(49):
            now[0] += 1
            summary.count("nodemetric", "updated")
        assert caplog.records == []  # under a minute: nothing yet
        now[0] = 1060.0
        summary.count("nodemetric", "updated")
        assert [r.getMessage() for r in caplog.records] == ["k8s writer, last 60 s: 50 nodemetric updated, 0 failed"]
        now[0] = 1070.0
        summary.count("node", "failed")
        now[0] = 1120.0
        summary.count("node", "updated")
    assert [r.getMessage() for r in caplog.records][1:] == [
        "k8s writer, last 60 s: 1 node failed, 1 node updated, 1 failed"
    ]
    assert all(r.levelno == logging.INFO for r in caplog.records)
