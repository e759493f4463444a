"""KOORDBUS_LOG_FORMAT / --log-format on a real `koordbus` process: json makes every stderr line a JSON object;
an unknown format stops the process with the choices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def _upgrade(database: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "koordbus.cli", "db", "upgrade", "--database-url", f"sqlite:///{database}"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120, env={**os.environ, **env})


def test_json_log_format_from_the_environment_makes_every_line_a_json_object(tmp_path: Path) -> None:
    done = _upgrade(tmp_path / "a.db", env={"KOORDBUS_LOG_FORMAT": "json", "KOORDBUS_LOG_LEVEL": "INFO"})
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert any("Running upgrade" in line for line in lines)  # the migrations logged something
    for line in lines:
        entry = json.loads(line)
        assert {"time", "level", "logger", "message"} <= set(entry)
        assert "event_id" not in entry  # nothing here handles an event


def test_the_flag_overrides_the_environment_and_text_is_the_default(tmp_path: Path) -> None:
    done = _upgrade(tmp_path / "b.db", "--log-format", "text", env={"KOORDBUS_LOG_FORMAT": "json"})
    assert done.returncode == 0, done.stderr
    assert done.stderr and not done.stderr.lstrip().startswith("{")
    plain = _upgrade(tmp_path / "c.db", env={"KOORDBUS_LOG_FORMAT": ""})  # empty: the default
    assert plain.returncode == 0, plain.stderr
    assert "INFO    alembic.runtime.migration: Running upgrade" in plain.stderr


def test_an_unknown_log_format_stops_the_process_naming_the_choices(tmp_path: Path) -> None:
    done = _upgrade(tmp_path / "d.db", env={"KOORDBUS_LOG_FORMAT": "xml"})
    assert done.returncode != 0
    assert "unknown log format 'xml': choose one of text, json" in done.stderr
