"""Two nodemetric replicas on one real nats-server and one database: the node partitions (KOORD_NODE's subject
transform) are split so every node is handled by exactly one replica, and a replica that dies hands its
partitions to the other, which rebuilds those nodes' windows (and the nodes' rows it had not written) from the
stream."""

from __future__ import annotations

import time
from pathlib import Path

from bus import streams, subjects
from bus.jetstream import JetStreamBus
from schemas.node import NodeMetricsReported, encode_node_event
from services.common import db
from services.common.metrics import new_registry
from services.nodemetric.service import NodeMetricService
from services.nodemetric.settings import NodeMetricSettings
from services.nodemetric.store import NodeMetricStore
from tests.support.waiting import eventually

NODES = [f"worker-{i}" for i in range(12)]


def batch(node: str, window_start: float) -> NodeMetricsReported:
    samples = [(window_start + s, 1.0, 2**30) for s in range(10)]
    return NodeMetricsReported(
        node=node, window_start=window_start, window_end=window_start + 10, sent_at=window_start + 10,
        node_samples=samples, system_samples=samples,
    )  # fmt: skip


async def publish_window(bus: JetStreamBus, window_start: float) -> None:
    for node in NODES:
        msg_id = f"{node}:{window_start}"
        await bus.publish(subjects.node_metrics(node), encode_node_event(batch(node, window_start)), msg_id=msg_id)


def replica(bus: JetStreamBus, store: NodeMetricStore, instance: str, *, write_every: float) -> NodeMetricService:
    """A replica recording every batch in the nodes' rows, written every `write_every` seconds."""
    settings = NodeMetricSettings(
        instance=instance,
        membership_ttl_seconds=4.0,
        report_phase_step_seconds=0,
        liveness_grid_seconds=0,
        projection_write_interval_seconds=write_every,
    )
    return NodeMetricService(bus, store, settings, registry=new_registry())


async def test_replicas_split_the_nodes_and_a_dead_replicas_partitions_move(
    tmp_path: Path, koordbus_bus: JetStreamBus
) -> None:
    url = f"sqlite:///{tmp_path / 'koordbus.db'}"
    await db.run_migrations(url)
    engine = db.create_engine(url)
    store = NodeMetricStore(engine)
    # the second writes its rows only when it stops: killed, it leaves them unwritten
    first = replica(koordbus_bus, store, "r1", write_every=0.5)
    second = replica(koordbus_bus, store, "r2", write_every=3600)
    start = (time.time() // 60) * 60 - 600
    try:
        await first.start()
        assert first.owned == frozenset(range(subjects.NODE_PARTITIONS))  # alone: every partition
        await second.start()
        for k in range(3):
            await publish_window(koordbus_bus, start + 10 * k)

        def split() -> bool:
            a, b = first.owned or frozenset(), second.owned or frozenset()
            return (
                not a & b
                and len(a | b) == subjects.NODE_PARTITIONS
                and set(first._windows).isdisjoint(second._windows)
                and set(first._windows) | set(second._windows) == set(NODES)
            )

        await eventually(split, timeout=20)
        assert first.owned and second.owned  # both hold a share
        # a replica's own durables go away an hour after it does (pod names change with every pod)
        info = await koordbus_bus.jetstream.consumer_info(streams.KOORD_NODE, "nodemetric-ingest-r1")
        assert info.config.inactive_threshold == 3600.0
        for node in NODES:  # the replica holding a node's window owns its partition
            holder = first if node in first._windows else second
            assert subjects.node_partition(node) in (holder.owned or ())

        # The first has written its own nodes' rows (the offsets it holds are past every window published)
        kept = set(first._windows)

        async def first_written() -> bool:
            return {r.node for r in await store.nodes_by_name(kept) if r.last_seen == start + 30} == kept

        await eventually(first_written, timeout=20)

        # The second replica dies (no farewell, its rows unwritten): after the TTL its partitions move, and the
        # first rebuilds the moved nodes' windows from the stream, keeps them up to date and writes their rows.
        moved = set(second._windows)
        second._membership = None  # as if killed: it never says goodbye
        second.node_rows._rows.clear()  # nor writes what it had not
        await second.stop()
        await publish_window(koordbus_bus, start + 30)
        await eventually(lambda: first.owned == frozenset(range(subjects.NODE_PARTITIONS)), timeout=20)
        await eventually(lambda: moved <= set(first._windows), timeout=20)
        await eventually(lambda: all((first._windows[n].newest_end or 0) >= start + 40 for n in NODES), timeout=20)

        async def every_row_written() -> bool:
            rows = await store.nodes_by_name(NODES)
            return [(r.first_seen, r.last_seen) for r in rows] == [(start + 10, start + 40)] * len(NODES)

        await eventually(every_row_written, timeout=20)
    finally:
        await first.stop()
        await second.stop()
        await engine.dispose()
