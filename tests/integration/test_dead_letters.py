"""Poison messages on a real nats-server: nodemetric dead-letters each one with its reason and keeps going.

Four bad messages (not msgpack, msgpack of the wrong type, a schema violation, an unknown event tag)
are published among a node's valid batches. Each must land on `koord.v1.dlq.nodemetric` with a
Koord-Dlq-Reason naming the problem, the ingest consumer must count exactly four dead letters
(also in /metrics), and the valid batches must still produce the node's NodeMetric.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import msgspec

from bus import streams, subjects
from bus.api import (
    HEADER_DLQ_CONSUMER,
    HEADER_DLQ_REASON,
    HEADER_DLQ_STREAM_SEQ,
    HEADER_DLQ_SUBJECT,
    ConsumerSpec,
    Delivery,
)
from bus.jetstream import JetStreamBus
from schemas.node import NodeMetricsReported, encode_node_event
from services.api.app import ApiContext, create_app
from services.api.settings import ApiSettings
from services.common import db
from services.common.metrics import new_registry
from services.nodemetric import component as nodemetric_component
from services.nodemetric.service import INGEST_CONSUMER, NodeMetricService
from services.nodemetric.settings import NodeMetricSettings
from services.nodemetric.store import NodeMetricStore
from tests.support import api_auth
from tests.support.crd import assert_valid_nodemetric

NODE = "node-x"
T0 = 1_750_000_020.0  # on a minute boundary: the first report is due at T0 + 60


class _Collect:
    """A handler that keeps every dead letter it is given."""

    def __init__(self) -> None:
        self.received: list[Delivery] = []

    async def handle(self, delivery: Delivery) -> None:
        self.received.append(delivery)

    async def flush(self) -> None:
        return None


def batch(k: int, *, cpu: float = 1.0) -> NodeMetricsReported:
    start = T0 + 10 * k
    return NodeMetricsReported(
        node=NODE,
        window_start=start,
        window_end=start + 10,
        sent_at=start + 10,
        node_samples=[(start + s, cpu, 2 << 30) for s in range(10)],
    )


POISON: dict[str, tuple[bytes, str]] = {
    # name: (payload, what its Koord-Dlq-Reason must say)
    # 0xc1 is the one opcode msgpack never uses.
    "not msgpack": (b"\xc1 cpu=1.5 mem=2G\n", "DecodeError: MessagePack data is malformed"),
    "wrong type": (
        msgspec.msgpack.encode(["node.metrics_reported.v1", "node-x"]),
        "ValidationError: Expected `object`, got `array`",
    ),
    "negative cpu": (encode_node_event(batch(3, cpu=-0.5)), "at `$.node_samples[0][1]`"),
    "unknown tag": (
        msgspec.msgpack.encode({"type": "node.metrics_reported.v9", "node": "node-x"}),
        "Invalid value 'node.metrics_reported.v9' - at `$.type`",
    ),
}


async def eventually(check: Callable[[], Awaitable[bool]], *, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.1)


async def test_poison_messages_are_dead_lettered_with_reasons_and_valid_batches_still_report(
    tmp_path: Path, koordbus_bus: JetStreamBus
) -> None:
    bus = koordbus_bus
    database_url = f"sqlite:///{tmp_path / 'koordbus.db'}"
    await db.run_migrations(database_url)
    engine = db.create_engine(database_url)
    store = NodeMetricStore(engine)
    registry = new_registry()
    service = NodeMetricService(bus, store, NodeMetricSettings(report_phase_step_seconds=0), registry=registry)
    dead_letters = _Collect()
    reader = bus.consume(
        ConsumerSpec(
            durable="test-dlq-reader",
            stream=streams.KOORD_DLQ,
            filter_subjects=(subjects.dlq("nodemetric"),),
            service="test-dlq-reader",
        ),
        dead_letters,
    )
    await service.start()
    subject = subjects.node_metrics(NODE)
    try:
        # Poison interleaved with the node's batches, so valid messages share fetches with bad ones.
        poison = iter(POISON.items())
        for k in range(8):
            await bus.publish(subject, encode_node_event(batch(k)), msg_id=f"batch:{k}")
            name_payload = next(poison, None)
            if name_payload is not None:
                name, (payload, _) = name_payload
                await bus.publish(subject, payload, msg_id=f"poison:{name}")
        _projector, ingest = service.consumers

        async def settled() -> bool:
            reported = await store.get(NODE)
            return reported is not None and ingest.stats.dead_lettered >= 4 and len(dead_letters.received) >= 4

        await eventually(settled)
        assert await ingest.wait_idle(10)
        app = create_app(
            ApiContext(
                settings=ApiSettings(),
                components=(nodemetric_component.reads(store),),
                registry=registry,
                tokens=api_auth.token_store(),
            )
        )
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), headers=api_auth.headers(), base_url="http://api"
        ) as client:
            metrics = (await client.get("/metrics")).text
            nodemetric = (await client.get(f"/api/v1/nodemetrics/{NODE}")).json()
    finally:
        await service.stop()
        await reader.stop()
        await engine.dispose()

    by_payload = {d.data: d for d in dead_letters.received}
    assert len(dead_letters.received) == 4
    for name, (payload, reason) in POISON.items():
        letter = by_payload.get(payload)
        assert letter is not None, f"{name} was not dead-lettered"
        assert reason in letter.headers[HEADER_DLQ_REASON], (name, letter.headers[HEADER_DLQ_REASON])
        assert letter.headers[HEADER_DLQ_SUBJECT] == f"{subject}.{subjects.node_partition(NODE)}"  # as stored
        assert letter.headers[HEADER_DLQ_CONSUMER] == INGEST_CONSUMER
        assert int(letter.headers[HEADER_DLQ_STREAM_SEQ]) > 0
        assert letter.subject == subjects.dlq("nodemetric")

    stats = ingest.stats
    assert (stats.dead_lettered, stats.termed, stats.acked) == (4, 4, 8)
    assert 'koordbus_consumer_dead_lettered_total{consumer="nodemetric-ingest",service="nodemetric"} 4.0' in metrics
    assert 'koordbus_consumer_dead_lettered_total{consumer="nodemetric-projector",service="nodemetric"} 0.0' in metrics

    # The valid batches were applied: the report at T0 + 60 holds the 1-core samples, the poison changed nothing.
    assert_valid_nodemetric(nodemetric)
    assert nodemetric["status"]["updateTime"] == "2025-06-15T15:08:00Z"
    assert nodemetric["status"]["nodeMetric"]["nodeUsage"]["resources"]["cpu"] == "1"
