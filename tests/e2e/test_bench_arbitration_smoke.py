"""bench/arbitration.py at toy size: one JSON line with the documented keys and outcomes that add up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "arbitration.py"
KEYS = {
    "bench", "jobs", "pods", "workloads", "nodes", "view_build_ms", "round_p50_ms", "round_p99_ms", "round_max_ms",
    "first_round_ms",
    "rounds", "churn", "jobs_per_s", "passed", "failed", "waiting", "target_held", "target_misses", "command",
}  # fmt: skip
TOY = [sys.executable, str(SCRIPT), "--jobs", "200", "--workloads", "40", "--nodes", "30"]


def test_prints_one_json_line_with_sane_figures() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--jobs", "200", "--workloads", "40", "--nodes", "30", "--rounds", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert set(result) == KEYS
    assert result["passed"] + result["failed"] + result["waiting"] == 200
    assert 0 < result["passed"] < 200  # the limits hold some back
    assert 0 < result["round_p50_ms"] <= result["round_p99_ms"] <= result["round_max_ms"]
    assert result["rounds"] == 2


def test_churn_changes_jobs_between_rounds_and_shows_in_the_command() -> None:
    run = subprocess.run(
        [*TOY, "--rounds", "3", "--churn", "20"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["churn"] == 20 and result["command"].endswith("--churn 20")
    assert result["passed"] + result["failed"] + result["waiting"] == 200


def test_too_few_pods_is_a_usage_error() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--jobs", "1000", "--workloads", "2"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2 and "give more --workloads" in run.stderr
