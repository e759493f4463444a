"""bench/loadaware.py at toy size: one JSON line with the documented keys and figures that hang together."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "loadaware.py"
KEYS = {
    "bench", "nodes", "pods_per_node", "requests", "server_cpu", "node_qos", "filter_p50_ms", "filter_p99_ms",
    "prioritize_p50_ms", "prioritize_p99_ms", "total_p50_ms", "total_p99_ms", "total_max_ms",
    "filtered_out_nodes_median", "target_p99_ms", "target_held", "command",
}  # fmt: skip


@pytest.mark.parametrize("node_qos", [False, True])
def test_prints_one_json_line_with_sane_figures(node_qos: bool) -> None:
    command = [sys.executable, str(SCRIPT), "--nodes", "300", "--pods-per-node", "5", "--requests", "20"]
    flags = ["--warmup", "2", *(["--node-qos"] if node_qos else [])]
    run = subprocess.run([*command, *flags], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert set(result) == KEYS
    assert (result["nodes"], result["requests"], result["node_qos"]) == (300, 20, node_qos)
    assert 0 < result["filter_p50_ms"] <= result["filter_p99_ms"]
    assert 0 < result["total_p50_ms"] <= result["total_p99_ms"] <= result["total_max_ms"]
    assert result["total_p99_ms"] >= result["filter_p50_ms"]
    assert 0 <= result["filtered_out_nodes_median"] < 300  # some nodes are hot, not all
    assert result["target_held"] == (result["total_p99_ms"] < 20.0)
