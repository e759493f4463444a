"""bench/psi_ingest.py at toy size: one JSON line, and pod PSI makes a batch bigger and costs ingest work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "psi_ingest.py"


def test_prints_one_json_line_with_both_costs() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--pods", "10", "--batches", "6"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    (line,) = run.stdout.strip().splitlines()
    result = json.loads(line)
    assert result["bench"] == "psi_ingest" and result["pods_per_batch"] > 0
    assert result["bytes_with_pod_psi"] > result["bytes_without_pod_psi"]
    assert result["batch_us_without_pod_psi"] > 0 and result["batch_us_with_pod_psi"] > 0
