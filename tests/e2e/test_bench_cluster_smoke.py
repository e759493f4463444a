"""bench/cluster.py at toy size: one JSON line with the ingest figures on three clustered nats-servers with R3
streams and the failover figures — a new KOORD_NODE leader elected, every acknowledged probe stored exactly once,
the service not restarted — and nothing left running or on disk afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "cluster.py"


def test_the_cluster_bench_prints_ingest_and_failover_figures(tmp_path: Path) -> None:
    command = [
        sys.executable, str(SCRIPT), "--nodes", "40", "--pods", "5", "--warmup", "2", "--duration", "4",
        "--failover-seconds", "20", "--failover-kill-after", "4",
    ]  # fmt: skip
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=220, env={**os.environ, "TMPDIR": str(tmp_path)}
    )
    assert run.returncode == 0, run.stderr
    (line,) = run.stdout.splitlines()
    result = json.loads(line)
    assert result["bench"] == "cluster" and result["servers"] == 3 and result["stream_replicas"] == 3
    assert result["batches_per_s"] > 0 and result["publish_errors"] == 0
    failover = result["failover"]
    assert failover["elected"] != failover["killed"] and 0 < failover["election_s"] < 30
    assert failover["acked_stored_exactly_once"] and failover["probe_errors"] == 0
    assert failover["first_ack_after_kill_s"] is not None and failover["ingest_recovered_s"] is not None
    assert result["command"].startswith("python bench/cluster.py --nodes 40")
    assert not list(tmp_path.iterdir())  # the work directory is gone
