"""The agent against a real nats-server that goes away: batches are buffered (bounded, oldest dropped and
counted) and delivered in order once the server is back, with the drop count carried in the stream."""

from __future__ import annotations

from pathlib import Path

import msgspec

from agent.service import AgentService
from agent.settings import AgentSettings
from bus import streams, subjects
from bus.api import ConsumerSpec, Delivery
from bus.cluster import free_port
from bus.jetstream import JetStreamBus
from bus.server import EmbeddedNatsServer
from schemas.node import NodeMetricsReported
from tests.cgroup_tree import FakeCgroupTree

NODE = "outage-node"


class Collect:
    def __init__(self) -> None:
        self.batches: list[NodeMetricsReported] = []

    async def handle(self, delivery: Delivery) -> None:
        self.batches.append(msgspec.msgpack.decode(delivery.data, type=NodeMetricsReported))

    async def flush(self) -> None:
        return None


async def test_agent_buffers_while_nats_is_down_and_catches_up(tmp_path: Path) -> None:
    tree = FakeCgroupTree(root=tmp_path / "node", version=1, driver="cgroupfs")
    tree.write()
    port = free_port()
    server = EmbeddedNatsServer(store_dir=tmp_path / "nats", port=port)
    await server.start()
    bus = await JetStreamBus.connect(server.url, name="outage-test")
    await bus.ensure_streams(streams.all_streams())
    now = [1_750_000_000.0]
    settings = AgentSettings(
        node_name=NODE,
        proc_root=str(tree.proc_root),
        cgroup_root=str(tree.cgroup_root),
        max_buffered_batches=2,
        publish_timeout=0.2,
    )
    agent = AgentService(settings, bus, clock=lambda: now[0])

    async def run_for(seconds: int) -> None:
        for _ in range(seconds):
            await agent.collect_once()
            now[0] += 1.0
            tree.proc.user += 100
            tree.proc.idle += 300
            tree.write()

    try:
        await run_for(21)  # windows 0 and 10 are sent
        assert agent.stats.batches_sent == 2
        await server.stop()
        await run_for(40)  # windows 20, 30, 40, 50 close while the server is down: only the newest 2 are kept
        assert agent.stats.batches_sent == 2
        assert agent.stats.dropped_batches == 2
        assert agent.stats.buffered_batches == 2
        server = EmbeddedNatsServer(store_dir=tmp_path / "nats", port=port)
        await server.start()
        for _ in range(100):  # the client reconnects by itself; the agent probes once per collection
            await run_for(1)
            if agent.stats.buffered_batches == 0:
                break
        assert agent.stats.buffered_batches == 0
        await run_for(10)  # a drop is reported by the next batch built after it: let one more window close

        collected = Collect()
        spec = ConsumerSpec(
            durable="outage-check", stream=streams.KOORD_NODE, filter_subjects=(subjects.NODE_METRICS_ALL,), service="t"
        )
        consumer = bus.consume(spec, collected)
        assert await consumer.wait_idle(20)
        await consumer.stop()
    finally:
        await bus.close()
        await server.stop()

    starts = [int(b.window_start - 1_750_000_000) for b in collected.batches]
    assert starts == sorted(starts), "batches arrive in window order"
    # The outbox dropped 20 and 30 and kept 40 and 50. (The NATS client may still deliver a dropped batch it had
    # buffered during the reconnect; the drop count is an upper bound on what is missing, never an undercount.)
    assert {0, 10, 40, 50} <= set(starts)
    missing = set(range(0, max(starts) + 1, 10)) - set(starts)
    assert len(missing) <= 2 and missing <= {20, 30}
    assert sum(b.dropped_batches for b in collected.batches) == 2
