"""bench/natsauth_connect.py at toy size: one JSON line, every connect authenticated (an agent through the callout,
a service user by the server), and the figures hang together."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "natsauth_connect.py"


def test_prints_one_json_line_with_both_kinds_of_connect() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--connects", "10"], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    (line,) = run.stdout.strip().splitlines()
    result = json.loads(line)
    assert result["connects"] == 10
    for kind in ("agent_via_callout", "service_user"):
        figures = result[kind]
        assert 0 < figures["p50_ms"] <= figures["p99_ms"] and figures["mean_ms"] > 0
    assert result["callout_cost_p50_ms"] == pytest.approx(
        result["agent_via_callout"]["p50_ms"] - result["service_user"]["p50_ms"], abs=0.002
    )
