"""bench/nodemetric_cpu.py at toy size: one JSON line with the documented keys, every node's report and training
round of the measured minute made once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "nodemetric_cpu.py"
KEYS = {
    "bench", "command", "nodes", "pods", "batches", "reports", "training_rounds", "cpu_s", "cpu_per_batch_us",
    "batches_per_core_s", "window_cpu_per_batch_us", "busiest_window_batches_per_core_s", "calibration_ms",
}  # fmt: skip


def test_prints_one_json_line_with_a_report_and_a_round_per_node_and_minute() -> None:
    flags = ["--nodes", "12", "--pods", "10", "--warmup-minutes", "2", "--minutes", "1"]
    run = subprocess.run([sys.executable, str(SCRIPT), *flags], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1, run.stdout
    result = json.loads(lines[0])
    assert set(result) == KEYS
    # 12 nodes, 6 batches a minute; each node reports once a minute (at its phase) and trains once: its round is
    # applied at its report, or at the minute's end for the nodes whose phase is 0
    assert (result["batches"], result["reports"], result["training_rounds"]) == (72, 12, 12)
    costs = result["window_cpu_per_batch_us"]
    assert result["calibration_ms"] > 0
    assert 0 < costs["min"] <= result["cpu_per_batch_us"] <= costs["max"]
    assert result["command"] == "python bench/nodemetric_cpu.py " + " ".join(flags)
    assert "window 18 of 18 (measured)" in run.stderr


def test_refuses_a_measurement_of_nothing() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--minutes", "0"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--minutes" in run.stderr and not run.stdout
