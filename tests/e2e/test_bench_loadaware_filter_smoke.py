"""bench/loadaware_filter.py at toy size: one JSON line with the documented keys and figures that hang together."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "loadaware_filter.py"
KEYS = {
    "bench", "nodes", "repeats", "node_qos", "filter_median_ms", "filter_p99_ms", "rejected_nodes",
    "config_rebuild_ms", "command",
}  # fmt: skip


def test_prints_one_json_line_and_the_caps_reject_more_nodes() -> None:
    results = []
    for flags in ([], ["--node-qos"]):
        command = [sys.executable, str(SCRIPT), "--nodes", "300", "--repeats", "20", *flags]
        run = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        (line,) = run.stdout.strip().splitlines()
        result = json.loads(line)
        assert set(result) == KEYS
        assert (result["nodes"], result["repeats"], result["node_qos"]) == (300, 20, bool(flags))
        assert 0 < result["filter_median_ms"] <= result["filter_p99_ms"]
        assert 0 <= result["rejected_nodes"] < 300 and result["config_rebuild_ms"] > 0
        results.append(result)
    assert results[1]["rejected_nodes"] > results[0]["rejected_nodes"]  # the BE pod is capped under eviction
