"""nats-server killed (SIGKILL) and restarted under a publishing agent: nothing acknowledged is lost, nothing stored
twice, nothing the agent built goes missing.

A real nats-server with a file store and sync_interval "always" (every message is fsynced before it is
acknowledged), a real `koordbus agent` process (metrics half only) on a generated /proc and cgroup v1 tree,
publishing a batch every 0.5 s. The server is killed twice, at seeded random moments and for seeded random
lengths, and started again on the same port and store directory. The agent must buffer the batches that close
meanwhile (its outbox) and resend them once the server is back. Afterwards the stream holds every batch the agent
counted as sent (its /metrics `batches_sent` counter: acknowledged by the stream), each window exactly once
(the Nats-Msg-Id dedups resends of batches whose acknowledgement was lost with the server), with no gap from the
agent's first window to its last.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import msgspec
import pytest
import pytest_asyncio

from bus import streams, subjects
from bus.cluster import free_port
from bus.jetstream import JetStreamBus
from bus.server import EmbeddedNatsServer
from schemas.node import NodeMetricsReported
from tests.cgroup_tree import FakeCgroupTree
from tests.faults.processes import KoordbusProcess, stream_messages, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.timeout(90)]

NODE = "fault-agent-node"
PUBLISH_INTERVAL = 0.5
SEED_ENV = "KOORDBUS_FAULTS_SEED"


@pytest_asyncio.fixture
async def server(tmp_path: Path) -> AsyncIterator[EmbeddedNatsServer]:
    server = EmbeddedNatsServer(tmp_path / "nats", port=free_port(), sync_interval="always")
    await server.start()
    setup = await JetStreamBus.connect(server.url, name="faults-setup")
    await setup.ensure_streams(streams.all_streams())
    await setup.close()
    try:
        yield server
    finally:
        await server.stop()


async def _agent_counters(port: int) -> dict[str, float]:
    """The agent's metrics-part counters, e.g. {"batches_sent": 12.0, …}."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=2) as http:
        text = (await http.get("/metrics")).text
    pattern = re.compile(rf'^koordbus_agent_(\w+?)(?:_total)?\{{node="{NODE}",part="metrics"\}} (\S+)$', re.M)
    return {name: float(value) for name, value in pattern.findall(text)}


async def _stored_windows(url: str) -> list[float]:
    bus = await JetStreamBus.connect(url, name="faults-check")
    try:
        stored = await stream_messages(bus, streams.KOORD_NODE, subjects.stored(subjects.node_metrics(NODE)))
    finally:
        await bus.close()
    return [msgspec.msgpack.decode(m.data, type=NodeMetricsReported).window_start for m in stored]


async def test_the_agent_resends_across_nats_restarts_and_nothing_acknowledged_is_lost(
    tmp_path: Path, server: EmbeddedNatsServer
) -> None:
    seed = int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(1 << 31))
    rng = random.Random(seed)
    context = f"seed {seed} ({SEED_ENV}={seed} reproduces it)"
    tree = FakeCgroupTree(root=tmp_path / "node", version=1, driver="cgroupfs")
    tree.write()
    url = server.url
    port = free_port()
    arguments = [
        "agent", "--nats-url", url, "--node-name", NODE, "--no-qos", "--port", str(port),
        "--proc-root", str(tree.proc_root), "--cgroup-root", str(tree.cgroup_root),
        "--publish-interval", str(PUBLISH_INTERVAL), "--state-dir", str(tmp_path / "state"),
    ]  # fmt: skip
    agent = KoordbusProcess(
        arguments,
        log_path=tmp_path / "agent.log",
        env={
            "KOORDBUS_COLLECT_INTERVAL": "0.1",
            "KOORDBUS_PUBLISH_TIMEOUT": "0.5",
            "KOORDBUS_CGROUP_DRIVER": "cgroupfs",
            "KOORDBUS_CGROUP_VERSION": "1",
        },
    )

    async def counters() -> dict[str, float]:
        agent.assert_alive()
        return await _agent_counters(port)

    async def sent_at_least(n: float) -> bool:
        try:
            return (await counters()).get("batches_sent", 0) >= n
        except httpx.HTTPError:
            return False

    agent.start()
    try:
        await wait_for(lambda: sent_at_least(2), timeout=30, what=f"{context}: the agent's first batches")
        outages: list[tuple[float, float]] = []
        for _ in range(2):
            await asyncio.sleep(rng.uniform(0.0, 1.5))
            down_for = rng.uniform(1.0, 2.5)
            before = await counters()
            await server.kill()
            await asyncio.sleep(down_for)
            await server.start()
            assert server.url == url
            outages.append((before["batches_sent"], down_for))

            async def resent(before: dict[str, float] = before) -> bool:
                now = await counters()
                return now["buffered_batches"] == 0 and now["batches_sent"] >= before["batches_sent"] + 3

            await wait_for(resent, timeout=30, what=f"{context}: the agent's backlog sent after the restart")
        final = await counters()
        windows = await _stored_windows(url)
        agent.stop()
        after_stop = await _stored_windows(url)
    finally:
        agent.kill()

    what = f"{context}, outages (sent before, seconds down): {outages}, agent counters {final}"
    assert final["publish_failures"] > 0, f"{what}: the agent never noticed the server was away"
    assert final["dropped_batches"] == 0 and final["rejected_batches"] == 0, f"{what}: batches dropped"
    assert len(windows) >= final["batches_sent"], f"{what}: acknowledged batches missing: {len(windows)} stored"
    for stored in (windows, after_stop):
        assert len(stored) == len(set(stored)), f"{what}: a window stored twice: {sorted(stored)}"
        expected = [stored[0] + i * PUBLISH_INTERVAL for i in range(len(stored))]
        assert sorted(stored) == pytest.approx(expected), f"{what}: windows missing: {sorted(stored)}"
