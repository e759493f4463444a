"""bench/agent.py at toy size: the real agent process runs, one JSON line with the documented keys; the first rounds
write the BE pods' values, and the agent warns of nothing but its start-up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "agent.py"
KEYS = {
    "bench", "pods", "seconds", "cpu_percent_of_one_core", "rss_mb", "peak_rss_mb", "qos_rounds", "collections",
    "convergence_writes", "steady_writes", "qos_problems", "new_pods", "pod_start_p50_ms", "pod_start_p99_ms",
    "pod_start_max_ms", "target_held", "command",
}  # fmt: skip


def test_prints_one_json_line_with_sane_figures() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--pods", "6", "--seconds", "2", "--new-pods", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert set(result) == KEYS
    # 3 BE pods × (pod + 2 containers) × 3 files, plus the resctrl groups whose schemata change
    assert result["convergence_writes"] >= 27
    assert result["steady_writes"] >= 0
    # the only problem allowed: the first rounds run before the collector has two readings to give a usage sample
    loop_warnings = [line for line in run.stderr.splitlines() if "WARNING agent." in line]
    assert all("no fresh CPU usage sample" in line for line in loop_warnings), run.stderr
    assert result["qos_problems"] <= 3
    assert result["qos_rounds"] >= 1 and result["collections"] >= 1
    # CPU is counted in clock ticks (10 ms): at toy size over 2 s it may round to 0
    assert result["cpu_percent_of_one_core"] >= 0 and result["peak_rss_mb"] > 10
    # three BE pods started afterwards each got their container's cpu.shares (30 s would mean it never came)
    assert result["new_pods"] == 3 and 0 < result["pod_start_p50_ms"] <= result["pod_start_max_ms"] < 30_000


def test_bad_arguments_are_a_usage_error() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--pods", "0"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--pods" in run.stderr
