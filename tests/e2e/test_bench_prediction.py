"""bench/prediction.py at toy size: one JSON line with the documented keys, every model restored bit for bit, and its
nats-server and temporary directory gone afterwards."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "prediction.py"
KEYS = {
    "bench", "nodes", "pods", "models", "model_bytes", "memory_per_million_models_mb", "cluster_fixture_mb",
    "gc_full_s", "gc_tracked_objects", "cpu_s_per_minute", "predictor_cores", "ms_per_node_minute", "snapshots",
    "snapshot_save_s", "snapshot_tick_max_s", "snapshot_stall_max_ms", "snapshot_stored_mb", "restored_nodes",
    "restore_s", "restore_exact", "target_held", "command",
}  # fmt: skip


def test_prints_one_json_line_and_restores_every_model(tmp_path: Path) -> None:
    flags = ["--nodes", "30", "--pods", "20", "--rounds", "3", "--measure-rounds", "1"]
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1, run.stdout
    result = json.loads(lines[0])
    assert set(result) == KEYS
    assert result["models"] == 30 * (20 + 7)  # each pod's, the node's, the system's and five priority classes'
    assert result["snapshots"] == result["restored_nodes"] == 30 and result["restore_exact"] is True
    assert isinstance(result["model_bytes"], int) and result["cpu_s_per_minute"] > 0  # RSS at toy size: noise
    nats = re.search(r"nats-server at nats://127\.0\.0\.1:(\d+)", run.stderr)
    assert nats, run.stderr
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", int(nats.group(1))), timeout=1):
        pass
    assert not list(tmp_path.glob("koordbus-bench-*"))


def test_refuses_sizes_below_one() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--nodes", "0"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--nodes" in run.stderr
