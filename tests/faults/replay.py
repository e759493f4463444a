"""A clean replay of the nodemetric and noderesource streams into a database, and the projected tables to compare.

What the services' projectors would have written had nothing gone wrong: every message of the streams, read once in
stream order, applied through the services' own stores under the services' own consumer names. Used by
tests/faults/test_postgres_outage.py to check that a service which lived through an outage caught up exactly.
"""

from __future__ import annotations

import msgspec
import sqlalchemy as sa

from bus import streams, subjects
from bus.api import Bus
from schemas.node import NODE_EVENT_DECODER, NodeMetricComputedRecord, NodeStateReported
from schemas.noderesource import NODERESOURCE_COMPUTED_DECODER
from services.common import db
from services.nodemetric import service as nodemetric
from services.nodemetric.store import NodeMetricStore
from services.noderesource import service as noderesource
from services.noderesource.store import NodeResourceStore

PROJECTED_TABLES = ("node_metrics", "nodes", "node_resource_decisions", "node_resources", "projection_offsets")
"""Tables that are projections of a stream (not the current-state tables written with wall-clock times)."""
READ_LIMIT = 1_000_000
_computed_decoder = msgspec.json.Decoder(NodeMetricComputedRecord)


async def projection_tables(url: str) -> dict[str, list[dict[str, object]]]:
    """Every row of PROJECTED_TABLES, in primary-key order."""
    engine = db.create_engine(url)
    try:
        async with engine.connect() as connection:
            metadata = sa.MetaData()
            await connection.run_sync(lambda sync: metadata.reflect(sync, only=PROJECTED_TABLES))
            tables: dict[str, list[dict[str, object]]] = {}
            for name in PROJECTED_TABLES:
                table = metadata.tables[name]
                result = await connection.execute(sa.select(table).order_by(*table.primary_key.columns))
                tables[name] = [dict(row) for row in result.mappings()]
            return tables
    finally:
        await engine.dispose()


async def replay_into(bus: Bus, url: str) -> dict[str, list[dict[str, object]]]:
    """Apply everything in the streams to the database at `url` (migrated first; what it already has is skipped,
    so calling this again after the streams grew applies only the new messages) and return its tables."""
    await db.run_migrations(url)
    engine = db.create_engine(url)
    try:
        nodemetric_store = NodeMetricStore(engine)
        states = await bus.read_recent(streams.KOORD_NODE, subjects.NODE_STATE_ALL, since=0, limit=READ_LIMIT)
        node_events: list[tuple[int, NodeStateReported]] = []
        for delivery in states:
            event = NODE_EVENT_DECODER.decode(delivery.data)
            assert isinstance(event, NodeStateReported)
            node_events.append((delivery.stream_seq, event))
        await nodemetric_store.apply_node_events(
            node_events,
            consumer=nodemetric.INGEST_CONSUMER,
            stream=streams.KOORD_NODE,
            partition=subjects.node_partition,  # as the service tracks them
        )
        computed = await bus.read_recent(
            streams.KOORD_NODEMETRIC, subjects.NODEMETRIC_COMPUTED_ALL, since=0, limit=READ_LIMIT
        )
        await nodemetric_store.apply_computed(
            [(d.stream_seq, _computed_decoder.decode(d.data)) for d in computed],
            consumer=nodemetric.PROJECTOR_CONSUMER,
            stream=streams.KOORD_NODEMETRIC,
            msg_ids={d.stream_seq: d.msg_id for d in computed},
        )
        decisions = await bus.read_recent(
            streams.KOORD_NODERESOURCE, subjects.NODERESOURCE_COMPUTED_ALL, since=0, limit=READ_LIMIT
        )
        await NodeResourceStore(engine).apply_decisions(
            [(d.stream_seq, NODERESOURCE_COMPUTED_DECODER.decode(d.data)) for d in decisions],
            consumer=noderesource.PROJECTOR_CONSUMER,
            stream=streams.KOORD_NODERESOURCE,
            msg_ids={d.stream_seq: d.msg_id for d in decisions if d.msg_id},
        )
    finally:
        await engine.dispose()
    return await projection_tables(url)
