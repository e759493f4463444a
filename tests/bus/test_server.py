"""EmbeddedNatsServer: start, readiness, files in the data dir, clean stop, and a clear error when it dies."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bus.errors import BusUnavailableError
from bus.jetstream import JetStreamBus
from bus.memory import MemoryBus
from bus.server import EmbeddedNatsServer, NatsServerError, render_config
from tests.bus import Names, Recorder, wait_until


async def test_server_starts_serves_jetstream_and_stops(tmp_path: Path) -> None:
    async with EmbeddedNatsServer(tmp_path / "nats", sync_interval="always") as server:
        assert server.url.startswith("nats://127.0.0.1:")
        bus = await JetStreamBus.connect(server.url, name="server-test")
        names = Names()
        await bus.ensure_streams([names.stream_spec(storage="file")])
        ack = await bus.publish(names.subject("x"), b"kept", msg_id="k")
        assert ack.seq == 1
        await bus.close()
        process = server._process
        assert process is not None
        assert server.pid == process.pid
    assert process.returncode is not None  # stopped by the context manager
    assert "Server is ready" in (tmp_path / "nats" / "nats-server.log").read_text()
    assert (tmp_path / "nats" / "jetstream").is_dir()
    with pytest.raises(NatsServerError):
        _ = server.url
    with pytest.raises(NatsServerError):
        _ = server.pid


async def test_file_storage_survives_a_restart(tmp_path: Path) -> None:
    names = Names()
    async with EmbeddedNatsServer(tmp_path) as server:
        bus = await JetStreamBus.connect(server.url, name="before")
        await bus.ensure_streams([names.stream_spec(storage="file")])
        await bus.publish(names.subject("x"), b"durable", msg_id="d")
        await bus.close()
    async with EmbeddedNatsServer(tmp_path) as server:
        bus = await JetStreamBus.connect(server.url, name="after")
        last = await bus.last_on_subject(names.stream, names.subject("x"))
        await bus.close()
    assert last is not None and last.data == b"durable"


async def test_log_file_can_live_elsewhere(tmp_path: Path) -> None:
    log_file = tmp_path / "logs" / "nats.log"
    async with EmbeddedNatsServer(tmp_path / "store", log_file=log_file):
        pass
    assert "Server is ready" in log_file.read_text()


async def test_a_server_that_dies_reports_its_log(tmp_path: Path) -> None:
    taken = EmbeddedNatsServer(tmp_path / "first")
    await taken.start()
    try:
        port = int(taken.url.rsplit(":", 1)[1])
        clash = EmbeddedNatsServer(tmp_path / "second", port=port)
        with pytest.raises(NatsServerError, match="exited with code") as info:
            await clash.start()
        assert "address already in use" in str(info.value)
    finally:
        await taken.stop()


async def test_stop_is_idempotent(tmp_path: Path) -> None:
    server = EmbeddedNatsServer(tmp_path)
    await server.start()
    await server.stop()
    await server.stop()
    with pytest.raises(NatsServerError):
        _ = server.url
    await asyncio.sleep(0)


def test_config_is_loopback_with_jetstream_and_optional_sync(tmp_path: Path) -> None:
    text = render_config(store_dir=tmp_path / "js", ports_dir=tmp_path, port=-1, sync_interval="2m")
    assert "host: 127.0.0.1" in text
    assert "port: -1" in text
    assert f'store_dir: "{tmp_path / "js"}"' in text
    assert 'sync_interval: "2m"' in text
    assert "http" not in text  # no monitoring port
    assert "sync_interval" not in render_config(store_dir=tmp_path, ports_dir=tmp_path, port=4222, sync_interval=None)


async def test_bus_and_consumer_survive_a_server_restart(tmp_path: Path) -> None:
    names = Names()
    first = EmbeddedNatsServer(tmp_path)
    await first.start()
    port = int(first.url.rsplit(":", 1)[1])
    bus = await JetStreamBus.connect(first.url, name="restart")
    try:
        await bus.ensure_streams([names.stream_spec(storage="file")])
        rec = Recorder()
        consumer = bus.consume(names.consumer(), rec)
        await bus.publish(names.subject("a"), b"before", msg_id="b")
        await wait_until(lambda: len(rec.committed) == 1)

        await first.stop()
        await asyncio.sleep(0.5)
        with pytest.raises(BusUnavailableError):
            await bus.stream_info(names.stream)
        async with EmbeddedNatsServer(tmp_path, port=port):
            await wait_until(lambda: bus._nc.is_connected, timeout=15)
            await bus.publish(names.subject("a"), b"after", msg_id="a")
            await wait_until(lambda: len(rec.committed) == 2, timeout=15)
            assert rec.committed_data() == [b"before", b"after"]
            await consumer.stop()
            await bus.close()
    finally:
        await bus.close()
        await first.stop()


async def test_shared_fixtures_give_working_buses(jetstream_bus: JetStreamBus, memory_bus: MemoryBus) -> None:
    for bus in (jetstream_bus, memory_bus):
        names = Names()
        await bus.ensure_streams([names.stream_spec()])
        ack = await bus.publish(names.subject("f"), b"x", msg_id="f")
        assert (ack.stream, ack.seq) == (names.stream, 1)
