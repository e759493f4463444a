"""`koordbus service migration` refuses an unusable MigrationControllerArgs file before it connects to anything,
with one line naming the file and the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_a_bad_args_file_stops_the_service_at_once(tmp_path: Path) -> None:
    bad = tmp_path / "args.yaml"
    bad.write_text("maxMigratingPerNode: -1\n")
    run = subprocess.run(
        [sys.executable, "-m", "koordbus.cli", "service", "migration", "--nats-url", "nats://127.0.0.1:1",
         "--args-file", str(bad), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert run.returncode != 0
    assert "koordbus: migration args: maxMigratingPerNode must not be negative" in run.stderr
    assert "Traceback" not in run.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "koordbus.cli", "service", "migration", "--nats-url", "nats://127.0.0.1:1",
         "--args-file", str(tmp_path / "nope.yaml"), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert missing.returncode != 0 and "nope.yaml" in missing.stderr
