"""bench/subscriptions.py at toy size: one JSON line with the documented keys, every client connected, events
delivered with plausible latencies, nothing left on disk afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "subscriptions.py"
DOCUMENTED_KEYS = {
    "bench", "clients", "broad_clients", "connected", "refused_or_ended", "nodes", "duration_s",
    "ingest_batches_per_s", "events_delivered", "deliveries_per_s", "latency_p50_s", "latency_p99_s",
    "latency_max_s", "api_cpu_cores", "api_rss_peak_mb", "dropped", "target_held", "command",
}  # fmt: skip


def test_prints_one_json_line_with_sane_figures(tmp_path: Path) -> None:
    command = [sys.executable, str(SCRIPT), "--clients", "20", "--broad", "2", "--nodes", "40", "--pods", "5"]
    command += ["--interval", "2", "--warmup", "32", "--duration", "10"]
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=240, env={**os.environ, "TMPDIR": str(tmp_path)}
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 1, run.stdout
    result = json.loads(lines[0])
    assert result.keys() >= DOCUMENTED_KEYS
    assert (result["bench"], result["clients"], result["connected"], result["dropped"]) == ("subscriptions", 20, 22, 0)
    # 40 nodes reporting every 30 s reach the 2 broad clients (every event) and each filtered client's node
    assert result["events_delivered"] >= 2 * 40 * 10 // 30
    assert 0 <= result["latency_p50_s"] <= result["latency_p99_s"] <= result["latency_max_s"] < 10
    assert result["api_cpu_cores"] > 0 and result["api_rss_peak_mb"] > 30
    assert result["command"].startswith("python bench/subscriptions.py --clients 20")
    assert list(tmp_path.iterdir()) == []
