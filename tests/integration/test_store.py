"""NodeMetricStore on SQLite and PostgreSQL: idempotent projection, ordering, atomic tracking, paging, replay, reset."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from schemas.node import (
    NodeMetricComputedRecord,
    NodeStateReported,
    PodRef,
)
from services.common import db
from services.nodemetric.store import NodeMetricStore, NodeSeen
from tests.support.events import nodemetric_computed
from tests.support.events import nodemetric_record as computed

STREAM = "KOORD_NODEMETRIC"
CONSUMER = "nodemetric-projection"
NODE_CONSUMER = "nodemetric-nodes"


async def dump(engine: AsyncEngine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every projection table, in a stable order."""
    tables = ("projection_offsets", "node_metrics", "nodes")
    async with engine.connect() as connection:
        return {
            name: [tuple(row) for row in await connection.execute(sa.text(f"SELECT * FROM {name} ORDER BY 1"))]
            for name in tables
        }


@pytest.fixture
def store(migrated_engine: AsyncEngine) -> NodeMetricStore:
    return NodeMetricStore(migrated_engine)


async def test_apply_computed_writes_and_reads_back_decoded_values(store: NodeMetricStore) -> None:
    event = nodemetric_computed("node-a", 1000.0, cpu_milli=1234)
    written = await store.apply_computed(
        [(7, NodeMetricComputedRecord.of(event))], consumer=CONSUMER, stream=STREAM, msg_ids={7: "abc"}
    )

    record = await store.get("node-a")
    assert written == 1
    assert record is not None
    assert record.status == event.status
    assert record.spec == event.spec
    assert (record.report_time, record.update_time, record.samples_in_window) == (1000.0, 1000.0, 300)
    assert (record.stream_seq, record.msg_id) == (7, "abc")
    assert await store.offset(CONSUMER) == 7
    assert await store.get("node-missing") is None


async def test_reapplying_the_same_sequences_changes_nothing(
    store: NodeMetricStore, migrated_engine: AsyncEngine
) -> None:
    batch = [(1, computed("node-a", 1000.0)), (2, computed("node-b", 1000.0))]
    assert await store.apply_computed(batch, consumer=CONSUMER, stream=STREAM) == 2
    before = await dump(migrated_engine)

    # A redelivery carries the same sequences, even if a buggy producer changed the payload.
    redelivered = [(1, computed("node-a", 1000.0, cpu_milli=9)), (2, computed("node-b", 5000.0))]
    assert await store.apply_computed(redelivered, consumer=CONSUMER, stream=STREAM) == 0
    assert await dump(migrated_engine) == before


async def test_partially_seen_batch_applies_only_new_sequences(store: NodeMetricStore) -> None:
    await store.apply_computed([(1, computed("node-a", 1000.0))], consumer=CONSUMER, stream=STREAM)
    batch = [(1, computed("node-a", 2000.0)), (2, computed("node-b", 1000.0))]
    assert await store.apply_computed(batch, consumer=CONSUMER, stream=STREAM) == 1
    assert (await store.last_report_times()) == {"node-a": 1000.0, "node-b": 1000.0}
    assert await store.offset(CONSUMER) == 2


async def test_older_report_never_overwrites_newer(store: NodeMetricStore) -> None:
    await store.apply_computed([(1, computed("node-a", 2000.0, cpu_milli=2000))], consumer=CONSUMER, stream=STREAM)
    written = await store.apply_computed(
        [(2, computed("node-a", 1000.0, cpu_milli=1000))], consumer=CONSUMER, stream=STREAM
    )

    record = await store.get("node-a")
    assert written == 0
    assert record is not None
    assert (record.report_time, record.stream_seq) == (2000.0, 1)
    assert record.status.node_metric.node_usage.resources["cpu"] == 2000
    assert await store.offset(CONSUMER) == 2, "a skipped event is still projected (consumed)"


async def test_out_of_order_reports_in_one_batch_keep_the_newest(store: NodeMetricStore) -> None:
    batch = [
        (1, computed("node-a", 3000.0, cpu_milli=3)),
        (2, computed("node-a", 1000.0, cpu_milli=1)),
        (3, computed("node-a", 2000.0, cpu_milli=2)),
    ]
    assert await store.apply_computed(batch, consumer=CONSUMER, stream=STREAM) == 1
    record = await store.get("node-a")
    assert record is not None
    assert (record.report_time, record.stream_seq) == (3000.0, 1)


async def test_failure_inside_the_transaction_leaves_rows_and_offset_unchanged(
    store: NodeMetricStore, migrated_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.apply_computed([(1, computed("node-a", 1000.0))], consumer=CONSUMER, stream=STREAM)
    before = await dump(migrated_engine)

    async def failing_record_offset(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("connection lost while recording the offset")

    # Rows are written before the offset; failing on the offset proves both roll back together.
    monkeypatch.setattr(db, "record_offset", failing_record_offset)
    with pytest.raises(RuntimeError, match="connection lost"):
        await store.apply_computed(
            [(2, computed("node-a", 2000.0)), (3, computed("node-b", 2000.0))], consumer=CONSUMER, stream=STREAM
        )
    with pytest.raises(RuntimeError, match="connection lost"):
        await store.apply_node_seen(
            [(2, NodeSeen(node="node-c", window_end=10.0))], consumer=NODE_CONSUMER, stream="KOORD_NODE"
        )

    assert await dump(migrated_engine) == before
    monkeypatch.undo()
    assert await store.apply_computed([(2, computed("node-a", 2000.0))], consumer=CONSUMER, stream=STREAM) == 1


async def test_keyset_pagination_walks_every_node_once_in_name_order(store: NodeMetricStore) -> None:
    names = [f"node-{i:03d}" for i in range(23)]
    batch = [(seq, computed(name, 1000.0)) for seq, name in enumerate(reversed(names), start=1)]
    await store.apply_computed(batch, consumer=CONSUMER, stream=STREAM)

    seen: list[str] = []
    after: str | None = None
    pages = 0
    while page := await store.list(limit=10, after=after):
        pages += 1
        seen.extend(record.node for record in page)
        after = page[-1].node
    assert seen == names
    assert pages == 3
    assert [record.node for record in await store.list(limit=5, after="node-020")] == names[21:]
    with pytest.raises(ValueError, match="limit"):
        await store.list(limit=0)


async def test_node_seen_and_state_build_the_nodes_table(store: NodeMetricStore) -> None:
    seen = [
        (1, NodeSeen(node="node-a", window_end=100.0)),
        (2, NodeSeen(node="node-b", window_end=101.0, dropped_batches=1)),
        (3, NodeSeen(node="node-a", window_end=110.0, dropped_batches=2)),
    ]
    assert await store.apply_node_seen(seen, consumer=NODE_CONSUMER, stream="KOORD_NODE") == 2
    state = NodeStateReported(
        node="node-a",
        at=105.0,
        agent_version="0.1.0",
        cpu_cores=16.0,
        memory_total=64 << 30,
        cgroup_version=2,
        cgroup_driver="systemd",
        pods=[PodRef(uid="u-1"), PodRef(uid="u-2")],
    )
    assert await store.apply_node_state([(4, state)], consumer=NODE_CONSUMER, stream="KOORD_NODE") == 1
    assert await store.apply_node_seen(
        [(5, NodeSeen(node="node-a", window_end=120.0, dropped_batches=1))], consumer=NODE_CONSUMER, stream="KOORD_NODE"
    )

    nodes = {record.node: record for record in await store.nodes()}
    node_a = nodes["node-a"]
    assert (node_a.first_seen, node_a.last_seen, node_a.last_batch_seq, node_a.dropped_batches) == (100.0, 120.0, 5, 3)
    assert (node_a.cgroup_version, node_a.cgroup_driver, node_a.cpu_cores) == (2, "systemd", 16.0)
    assert (node_a.memory_total, node_a.pods, node_a.agent_version) == (64 << 30, 2, "0.1.0")
    node_b = nodes["node-b"]
    assert (node_b.first_seen, node_b.last_seen, node_b.dropped_batches, node_b.cgroup_version) == (101.0, 101.0, 1, 0)
    assert await store.offset(NODE_CONSUMER) == 5
    assert [record.node for record in await store.nodes(limit=1, after="node-a")] == ["node-b"]


async def test_state_for_an_unseen_node_creates_it(store: NodeMetricStore) -> None:
    state = NodeStateReported(node="node-z", at=50.0, cpu_cores=4.0)
    assert await store.apply_node_state([(1, state)], consumer=NODE_CONSUMER, stream="KOORD_NODE") == 1
    (record,) = await store.nodes()
    assert (record.node, record.first_seen, record.last_seen, record.cpu_cores, record.last_batch_seq) == (
        "node-z",
        50.0,
        50.0,
        4.0,
        0,
    )


async def test_mixed_node_batch_applies_seen_and_state_with_interleaved_sequences(store: NodeMetricStore) -> None:
    batch: list[tuple[int, NodeSeen | NodeStateReported]] = [
        (10, NodeSeen(node="node-a", window_end=100.0)),
        (11, NodeStateReported(node="node-a", at=99.0, cpu_cores=32.0, cgroup_version=1)),
        (12, NodeSeen(node="node-b", window_end=101.0)),
        (13, NodeStateReported(node="node-a", at=102.0, cpu_cores=48.0, cgroup_version=2)),
    ]
    assert await store.apply_node_events(batch, consumer=NODE_CONSUMER, stream="KOORD_NODE") == 2
    assert await store.apply_node_events(batch, consumer=NODE_CONSUMER, stream="KOORD_NODE") == 0

    node_a, node_b = await store.nodes_by_name(["node-b", "node-a", "node-unknown"])
    assert (node_a.node, node_a.cpu_cores, node_a.cgroup_version) == ("node-a", 48.0, 2)
    assert (node_a.first_seen, node_a.last_seen, node_a.last_batch_seq) == (99.0, 102.0, 10)
    assert (node_b.node, node_b.last_batch_seq) == ("node-b", 12)
    assert await store.nodes_by_name([]) == []
    assert await store.offset(NODE_CONSUMER) == 13


def _history() -> tuple[list[tuple[int, NodeMetricComputedRecord]], list[tuple[int, NodeSeen | NodeStateReported]]]:
    """A stream's worth of events with duplicates and out-of-order reports, as replay would see them."""
    computed_events = [
        (seq, computed(f"node-{seq % 4}", 1000.0 + 60 * (seq // 4) - (30 if seq % 5 == 0 else 0), cpu_milli=seq))
        for seq in range(1, 41)
    ]
    node_events: list[tuple[int, NodeSeen | NodeStateReported]] = [
        (seq, NodeSeen(node=f"node-{seq % 3}", window_end=float(seq), dropped_batches=seq % 2)) for seq in range(1, 31)
    ]
    node_events[10] = (11, NodeStateReported(node="node-1", at=11.0, cpu_cores=8.0))
    return computed_events, node_events


async def _project(
    store: NodeMetricStore,
    computed_events: Sequence[tuple[int, NodeMetricComputedRecord]],
    node_events: Sequence[tuple[int, NodeSeen | NodeStateReported]],
    *,
    batch_size: int,
) -> None:
    for start in range(0, len(computed_events), batch_size):
        await store.apply_computed(computed_events[start : start + batch_size], consumer=CONSUMER, stream=STREAM)
    for start in range(0, len(node_events), batch_size):
        await store.apply_node_events(
            node_events[start : start + batch_size], consumer=NODE_CONSUMER, stream="KOORD_NODE"
        )


async def test_replay_into_a_fresh_database_yields_identical_rows(
    store: NodeMetricStore, migrated_engine: AsyncEngine, tmp_path: Any
) -> None:
    computed_events, node_events = _history()
    # Live: small batches, and every batch redelivered once (at-least-once delivery).
    await _project(store, computed_events, node_events, batch_size=3)
    await _project(store, computed_events, node_events, batch_size=3)
    live = await dump(migrated_engine)

    replay_url = f"sqlite:///{tmp_path / 'replay.db'}"
    await db.run_migrations(replay_url)
    replay_engine = db.create_engine(replay_url)
    try:
        await _project(NodeMetricStore(replay_engine), computed_events, node_events, batch_size=16)
        replayed = await dump(replay_engine)
    finally:
        await replay_engine.dispose()

    assert replayed == live
    assert len(live["node_metrics"]) == 4 and len(live["nodes"]) == 3


async def test_reset_forgets_only_that_consumers_offset_and_rows(
    store: NodeMetricStore, migrated_engine: AsyncEngine
) -> None:
    computed_events, node_events = _history()
    await _project(store, computed_events, node_events, batch_size=8)
    nodes_before = (await dump(migrated_engine))["nodes"]

    await store.reset(CONSUMER)

    assert await store.list() == []
    assert await store.offset(CONSUMER) == 0
    assert await store.last_report_times() == {}
    after_reset = await dump(migrated_engine)
    assert after_reset["nodes"] == nodes_before
    assert [row[0] for row in after_reset["projection_offsets"]] == [NODE_CONSUMER]

    # Replaying from the start after a reset rebuilds the same rows.
    await _project(store, computed_events, [], batch_size=8)
    assert len(await store.list()) == 4
    assert await store.offset(CONSUMER) == 40


async def test_a_message_queued_twice_counts_once(store: NodeMetricStore) -> None:
    """A redelivered batch can be queued twice before one timed write: its drop count must not double."""
    twice = (4, NodeSeen(node="node-a", window_end=100.0, dropped_batches=2))
    await store.apply_node_events([twice, twice], consumer=NODE_CONSUMER, stream="KOORD_NODE")
    (node_a,) = await store.nodes_by_name(["node-a"])
    assert node_a.dropped_batches == 2


def _partition(node: str) -> int:
    return int(node.rsplit("-", 1)[1]) % 2


async def test_a_partition_taken_over_is_written_from_its_own_offset(store: NodeMetricStore) -> None:
    """Partitions move between replicas: the one taking a partition over replays it from before its own other
    partitions' offsets. Per-partition offsets write what the previous owner had not; one offset for every
    partition skipped it (nodes' last batches lost in a failover test)."""
    # Replica A wrote node-0's partition up to 20, replica B node-1's up to 30; then B takes node-0's partition
    # over and replays it from 10 (A had not written 24 and 28 when it lost the partition).
    await store.apply_node_events(
        [(10, NodeSeen(node="node-0", window_end=100.0)), (20, NodeSeen(node="node-0", window_end=200.0))],
        consumer=NODE_CONSUMER,
        stream="KOORD_NODE",
        partition=_partition,
    )
    await store.apply_node_events(
        [(30, NodeSeen(node="node-1", window_end=300.0))],
        consumer=NODE_CONSUMER,
        stream="KOORD_NODE",
        partition=_partition,
    )
    replayed = [
        (seq, NodeSeen(node="node-0", window_end=float(seq * 10), dropped_batches=1)) for seq in (10, 20, 24, 28)
    ]
    assert await store.apply_node_events(replayed, consumer=NODE_CONSUMER, stream="KOORD_NODE", partition=_partition)

    node_0, node_1 = await store.nodes_by_name(["node-0", "node-1"])
    assert (node_0.last_seen, node_0.last_batch_seq, node_0.dropped_batches) == (280.0, 28, 2)  # 10, 20 once
    assert node_1.last_batch_seq == 30
    assert (await store.offset(f"{NODE_CONSUMER}.p0"), await store.offset(f"{NODE_CONSUMER}.p1")) == (28, 30)

    await store.reset(NODE_CONSUMER)
    assert await store.nodes_by_name(["node-0", "node-1"]) == []
    assert (await store.offset(f"{NODE_CONSUMER}.p0"), await store.offset(f"{NODE_CONSUMER}.p1")) == (0, 0)
