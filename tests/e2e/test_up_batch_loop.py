"""`koordbus up --simulate-nodes` closes the simulation's loop: simulated batch pods run only within each node's batch
allocatable as the noderesource service decides it, so the dashboard's batch used / allocatable stays at or under
100 % (it showed 351 % when the simulated batch load ignored the decisions)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_up import free_port, get_json

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
NODES = 5
REPORT_INTERVAL = 30
"""NodeMetric's shortest report interval, so the test waits half what up's default (60 s) would make it."""


def test_simulated_batch_usage_stays_within_the_batch_allocatable(tmp_path: Path) -> None:
    port = free_port()
    command = [
        sys.executable, "-m", "koordbus.cli", "up", "--data-dir", str(tmp_path / "data"), "--port", str(port),
        "--no-agent", "--simulate-nodes", str(NODES), "--simulate-backfill", "600",
    ]  # fmt: skip
    env = {**os.environ, "KOORDBUS_REPORT_INTERVAL_SECONDS": str(REPORT_INTERVAL)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        token = ""
        decided_at: float | None = None
        rows: list[dict[str, object]] = []
        # every node has a batch allocatable, then a NodeMetric reported a full report interval after the first one
        while time.monotonic() < deadline:
            assert process.poll() is None, "koordbus up exited early"
            try:
                token = token or (tmp_path / "data" / "api-token").read_text().strip()
                rows = get_json(f"{base}/api/v1/overview/nodes", token)["items"]  # type: ignore[assignment]
            except OSError:
                rows = []
            with_allocatable = [r for r in rows if r["batchCpu"] is not None and r["reportTime"] is not None]
            if len(with_allocatable) == NODES:
                decided_at = decided_at or max(float(r["reportTime"]) for r in rows)  # type: ignore[arg-type]
                if all(float(r["reportTime"]) > decided_at + REPORT_INTERVAL for r in rows):  # type: ignore[arg-type]
                    break
            time.sleep(1.0)
        else:
            raise AssertionError(f"no NodeMetric after the batch resources were decided: {rows}")
        used = {r["name"]: (r["batchCpuUsed"], r["batchCpu"], r["batchMemoryUsed"], r["batchMemory"]) for r in rows}
        assert all(
            cpu_used <= cpu and memory_used <= memory  # type: ignore[operator]
            for cpu_used, cpu, memory_used, memory in used.values()
        ), used
        assert any(cpu_used for cpu_used, *_ in used.values()), used  # batch pods do run
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert "Traceback" not in output
