"""Issue #19 point 6: `koordbus up` as a user runs it lets no other local user in. Its embedded nats-server refuses
an anonymous connection and serves the generated credential every in-process client uses (data dir, mode 0600);
the data dir is 0700 and nothing in it (SQLite and its -wal/-shm, the API token, the credential, the load-aware
extender's CA, certificates and keys, the NATS store and logs) is readable by group or others, a data dir left
readable by an older version included."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from bus import auth
from bus.cluster import free_port

pytestmark = pytest.mark.e2e

READY_SECONDS = 60.0


@pytest.fixture
def up(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A `koordbus up` process on a data dir an older version left world-readable; (data dir, NATS URL)."""
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)
    (data / "api-token").write_text("an-old-admin-token\n")
    os.chmod(data / "api-token", 0o644)
    log = tmp_path / "up.log"
    command = [
        sys.executable, "-m", "koordbus.cli", "up", "--data-dir", str(data), "--port", str(free_port()), "--no-agent",
        "--extender-port", "0",
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    try:
        deadline = time.monotonic() + READY_SECONDS
        while "Ctrl-C stops." not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        found = re.search(r"NATS\s+(nats://127\.0\.0\.1:\d+)", log.read_text())
        assert found, log.read_text()
        yield data, found.group(1)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)


async def test_the_embedded_nats_refuses_anonymous_clients_and_admits_the_generated_credential(
    up: tuple[Path, str],
) -> None:
    data, url = up
    assert await _connect_reply(url, {}) == "-ERR 'Authorization Violation'"
    user, password = auth.read_creds((data / "nats-creds.json").read_text(), source="nats-creds.json")
    assert await _connect_reply(url, {"user": user, "pass": password}) == "PONG"
    client = await nats.connect(url, user=user, password=password, allow_reconnect=False)
    try:
        names = {info.config.name for info in await client.jetstream().streams_info()}
        assert "KOORD_NODE" in names  # the services created their streams as this same user
    finally:
        await client.close()


async def _connect_reply(url: str, credentials: dict[str, str]) -> str:
    """What nats-server answers a client's CONNECT (with `credentials`) and PING, in NATS's own protocol."""
    host, port = url.removeprefix("nats://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        assert (await reader.readline()).startswith(b"INFO ")
        connect = json.dumps({"verbose": False, "pedantic": False, "protocol": 1, **credentials})
        writer.write(f"CONNECT {connect}\r\nPING\r\n".encode())
        await writer.drain()
        return (await asyncio.wait_for(reader.readline(), timeout=10)).decode().strip()
    finally:
        writer.close()
        await writer.wait_closed()


def test_the_data_dir_and_everything_in_it_are_private(up: tuple[Path, str]) -> None:
    data, _ = up
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    extender = ("extender-ca.crt", "extender.crt", "extender.key", "extender-client.crt", "extender-client.key")
    for name in ("koordbus.db", "api-token", "nats-creds.json", "nats-server.log", *extender, "extender-url"):
        assert (data / name).is_file(), name
    assert (data / "api-token").read_text() == "an-old-admin-token\n"  # kept, only its mode changed
    leaky = [
        f"{path.relative_to(data)} {stat.S_IMODE(path.lstat().st_mode):o}"
        for path in (data, *data.rglob("*"))
        if not path.is_symlink() and stat.S_IMODE(path.lstat().st_mode) & 0o077
    ]
    assert leaky == []
