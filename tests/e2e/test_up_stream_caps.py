"""`koordbus up` caps the bytes of its high-volume streams (koordbus.settings.EmbeddedStreamSettings): a real `up`
process, its embedded nats-server asked for the streams' config as the user `up` generated, shows the default caps,
a cap set through its KOORDBUS_* variable, the streams left uncapped, and the banner naming the caps."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from bus import auth, streams
from bus.cluster import free_port
from koordbus.settings import EmbeddedStreamSettings

pytestmark = pytest.mark.e2e

READY_SECONDS = 60.0
MIB = 2**20


@pytest.fixture
def up(tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    """A `koordbus up` process with KOORD_NODERESOURCE's cap set through the environment: (data dir, NATS URL,
    banner)."""
    data, log = tmp_path / "data", tmp_path / "up.log"
    command = [
        sys.executable, "-m", "koordbus.cli", "up", "--data-dir", str(data), "--port", str(free_port()), "--no-agent",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "KOORDBUS_NODERESOURCE_STREAM_MAX_BYTES": str(3 * MIB)}
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + READY_SECONDS
        while "Ctrl-C stops." not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        banner = log.read_text()
        found = re.search(r"NATS\s+(nats://127\.0\.0\.1:\d+)", banner)
        assert found, banner
        yield data, found.group(1), banner
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)


async def test_up_puts_its_caps_on_the_streams(up: tuple[Path, str, str]) -> None:
    data, url, banner = up
    assert "streams capped: KOORD_NODE 1536 MiB, KOORD_NODEMETRIC 512 MiB, KOORD_NODERESOURCE 3 MiB" in banner
    user, password = auth.read_creds((data / "nats-creds.json").read_text(), source="nats-creds.json")
    client = await nats.connect(url, user=user, password=password, allow_reconnect=False)
    try:
        caps = {info.config.name: info.config.max_bytes for info in await client.jetstream().streams_info()}
    finally:
        await client.close()
    default = EmbeddedStreamSettings()
    assert caps[streams.KOORD_NODE] == default.node_stream_max_bytes == 1536 * MIB
    assert caps[streams.KOORD_NODEMETRIC] == default.nodemetric_stream_max_bytes == 512 * MIB
    assert caps[streams.KOORD_NODERESOURCE] == 3 * MIB
    uncapped = {streams.KOORD_QUOTA, streams.KOORD_QUOTA_STATUS, streams.KOORD_CLUSTER, streams.KOORD_MIGRATION,
                streams.KOORD_DLQ, streams.KOORD_MEMBERS, streams.KV_KOORD_SLO, streams.KOORD_PREDICTION,
                streams.KOORD_DESCHEDULER, streams.KOORD_CCP}  # fmt: skip
    assert {name for name, cap in caps.items() if cap == -1} == uncapped
