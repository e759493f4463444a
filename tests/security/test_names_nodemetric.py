"""Issue #19, names from agents: an agent may publish only on its own node's subjects, but the node its payload
names is its own to write (the schema caps its length at 253). nodemetric took that name for its reports, their
subjects and its database, so an agent could report for another node, or for its name plus a newline; now an event
whose node is not its subject's is dead-lettered with the reason, and the node's good batches still report (real
nats-server)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from bus import streams, subjects
from bus.api import HEADER_DLQ_REASON, ConsumerSpec
from bus.jetstream import JetStreamBus
from schemas.node import encode_node_event
from services.common import db
from services.common.metrics import new_registry
from services.nodemetric.service import NodeMetricService
from services.nodemetric.settings import NodeMetricSettings
from services.nodemetric.store import NodeMetricStore
from tests.integration.test_dead_letters import NODE, _Collect, batch
from tests.support.waiting import eventually


async def test_an_event_naming_another_node_than_its_subject_is_dead_lettered(
    tmp_path: Path, koordbus_bus: JetStreamBus
) -> None:
    bus = koordbus_bus
    url = f"sqlite:///{tmp_path / 'koordbus.db'}"
    await db.run_migrations(url)
    engine = db.create_engine(url)
    store = NodeMetricStore(engine)
    service = NodeMetricService(bus, store, NodeMetricSettings(report_phase_step_seconds=0), registry=new_registry())
    dead_letters = _Collect()
    reader = bus.consume(
        ConsumerSpec(
            durable="test-names-dlq",
            stream=streams.KOORD_DLQ,
            filter_subjects=(subjects.dlq("nodemetric"),),
            service="test-names-dlq",
        ),
        dead_letters,
    )
    await service.start()
    subject = subjects.node_metrics(NODE)
    spoofed = ["node-y", "node-x\n"]  # another node's name; its own with a newline (the old pattern ended in `$`)
    try:
        for k in range(8):
            await bus.publish(subject, encode_node_event(batch(k)), msg_id=f"batch:{k}")
            if k < len(spoofed):
                other = spoofed[k]
                event = msgspec.structs.replace(batch(k), node=other)
                await bus.publish(subject, encode_node_event(event), msg_id=f"spoofed:{k}")
        _projector, ingest = service.consumers

        async def settled() -> bool:
            return await store.get(NODE) is not None and len(dead_letters.received) >= 2

        await eventually(settled, timeout=30)
        assert await ingest.wait_idle(10)
    finally:
        await service.stop()
        await reader.stop()
        await engine.dispose()
    reasons = [d.headers[HEADER_DLQ_REASON] for d in dead_letters.received]
    assert len(reasons) == 2 and ingest.stats.dead_lettered == 2
    assert "names node 'node-y', its subject 'node-x'" in reasons[0]
    assert "at `$.node`" in reasons[1]
