"""bench/webhook.py at toy size: the real webhook process over TLS, one JSON line with the documented keys and figures
that hang together (every answer checked, the batch profile matching the asked fraction of Pods)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
KEYS = {
    "bench", "rate", "duration_seconds", "profiles", "namespaces", "connections", "requests", "achieved_rate",
    "patched_fraction", "errors", "p50_ms", "p99_ms", "max_ms", "service_cpu_cores", "service_rss_peak_mib",
    "startup_seconds", "target", "target_held", "target_misses", "command",
}  # fmt: skip


def test_prints_one_json_line_with_every_answer_checked() -> None:
    command = [sys.executable, str(ROOT / "bench" / "webhook.py"), "--rate", "40", "--duration", "2", "--warmup", "0.5"]
    command += ["--profiles", "3", "--namespaces", "5", "--match", "0.5"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = run.stdout.strip().splitlines()
    result = json.loads(line)
    assert set(result) == KEYS
    assert (result["rate"], result["requests"], result["errors"]) == (40.0, 80, 0)
    assert result["patched_fraction"] == 0.5
    assert 0 < result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert 20 < result["achieved_rate"] < 60 and result["service_cpu_cores"] > 0
    assert result["target_held"] is False and "offered 40 requests/s < 200" in result["target_misses"]
    assert result["command"].startswith("python bench/webhook.py --rate 40 --duration 2 --warmup 0.5")


QUOTA_KEYS = {
    "bench", "rate", "duration_seconds", "teams", "connections", "requests", "achieved_rate", "appended", "errors",
    "p50_ms", "p99_ms", "max_ms", "service_cpu_cores", "quota_service_cpu_cores", "service_rss_peak_mib",
    "quota_service_rss_peak_mib", "startup_seconds", "target", "target_held", "target_misses", "command",
}  # fmt: skip


def test_quotas_every_change_is_answered_allowed_and_appended_once() -> None:
    """--quotas: the webhook and the quota service; each UPDATE a change in the log (warm-up included)."""
    command = [sys.executable, str(ROOT / "bench" / "webhook.py"), "--quotas", "--rate", "40", "--duration", "2"]
    command += ["--warmup", "0.5", "--teams", "5"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = run.stdout.strip().splitlines()
    result = json.loads(line)
    assert set(result) == QUOTA_KEYS
    assert (result["bench"], result["rate"], result["requests"], result["errors"]) == ("webhook-quotas", 40.0, 80, 0)
    assert result["appended"] == 100  # 20 warm-up changes and 80 measured ones, one event each
    assert 0 < result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert 20 < result["achieved_rate"] < 60 and result["quota_service_cpu_cores"] > 0
    assert result["target"] == "p99 < 25 ms at 200 quota changes/s over TLS"
    assert result["target_held"] is False and "offered 40 requests/s < 200" in result["target_misses"]
    assert result["command"].startswith("python bench/webhook.py --rate 40 --duration 2 --warmup 0.5 --quotas")
