"""NodeResourceStore on SQLite and PostgreSQL: idempotent projection, latest-per-node, history pruning, paging,
and the recorded colocation config and node strategies."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from bus import streams
from schemas import vocab
from schemas.noderesource import NodeResourceComputed, ResourceExplanation
from services.noderesource.store import NodeResourceStore, NodeStrategyRecord

CONSUMER = "noderesource-projector"
STREAM = streams.KOORD_NODERESOURCE
T0 = 1_750_000_000.0
GI = 1024**3


def decision(node: str, at: float, *, batch_memory: int | None = 146 * GI, **fields: Any) -> NodeResourceComputed:
    values: dict[str, Any] = {
        "node": node,
        "computed_at": at,
        "trigger": ("nodemetric",),
        "outcome": "computed",
        "resources": {vocab.BATCH_CPU: 25_000, vocab.BATCH_MEMORY: batch_memory},
        "explanation": {vocab.BATCH_MEMORY: ResourceExplanation(value=batch_memory, message=f"memory at {at}")},
        "write_due": True,
        "write_reason": "first write",
        **fields,
    }
    return NodeResourceComputed(**values)


def make_store(engine: AsyncEngine, **kwargs: Any) -> NodeResourceStore:
    return NodeResourceStore(engine, **kwargs)


async def test_replaying_a_batch_changes_nothing(migrated_engine: AsyncEngine) -> None:
    store = make_store(migrated_engine)
    batch = [(1, decision("a", T0)), (2, decision("b", T0)), (3, decision("a", T0 + 60, batch_memory=100 * GI))]

    assert await store.apply_decisions(batch, consumer=CONSUMER, stream=STREAM, msg_ids={1: "m-1"}) == 3
    assert await store.apply_decisions(batch, consumer=CONSUMER, stream=STREAM) == 0
    assert await store.apply_decisions(batch[1:], consumer=CONSUMER, stream=STREAM) == 0

    assert await store.offset(CONSUMER) == 3
    history = await store.history("a", limit=10)
    assert [(r.stream_seq, r.decision.computed_at) for r in history] == [(3, T0 + 60), (1, T0)]
    assert history[1].msg_id == "m-1"
    latest = await store.latest("a")
    assert latest is not None and latest.stream_seq == 3
    assert latest.decision.resources[vocab.BATCH_MEMORY] == 100 * GI
    assert latest.decision.explanation[vocab.BATCH_MEMORY].message == f"memory at {T0 + 60}"


async def test_an_older_decision_does_not_replace_the_latest(migrated_engine: AsyncEngine) -> None:
    store = make_store(migrated_engine)
    await store.apply_decisions([(5, decision("a", T0 + 60))], consumer=CONSUMER, stream=STREAM)
    # Later in the stream but computed for an earlier time (in one batch and across batches).
    await store.apply_decisions(
        [(6, decision("a", T0, batch_memory=None, outcome="degraded", reason="stale"))],
        consumer=CONSUMER,
        stream=STREAM,
    )
    await store.apply_decisions([(7, decision("b", T0 + 10)), (8, decision("b", T0))], consumer=CONSUMER, stream=STREAM)

    latest_a, latest_b = await store.latest("a"), await store.latest("b")
    assert latest_a is not None and (latest_a.stream_seq, latest_a.decision.outcome) == (5, "computed")
    assert latest_b is not None and latest_b.stream_seq == 7
    assert len(await store.history("a", limit=10)) == 2  # the history keeps both
    assert await store.latest("ghost") is None


async def test_history_keeps_the_newest_rows_per_node(migrated_engine: AsyncEngine) -> None:
    store = make_store(migrated_engine, history_limit=3)
    seq = 0
    for _ in range(3):  # each round: two decisions of a, one of b
        items = []
        for _ in range(2):
            seq += 1
            items.append((seq, decision("a", T0 + seq)))
        seq += 1
        items.append((seq, decision("b", T0 + seq)))
        await store.apply_decisions(items, consumer=CONSUMER, stream=STREAM)

    a = await store.history("a", limit=100)
    b = await store.history("b", limit=100)
    assert [r.stream_seq for r in a] == [8, 7, 5]
    assert [r.stream_seq for r in b] == [9, 6, 3]
    assert [r.stream_seq for r in await store.history("a", limit=2)] == [8, 7]


async def test_list_pages_by_node_name(migrated_engine: AsyncEngine) -> None:
    store = make_store(migrated_engine)
    names = [f"node-{i:02d}" for i in range(7)]
    await store.apply_decisions(
        [(i + 1, decision(name, T0)) for i, name in enumerate(reversed(names))], consumer=CONSUMER, stream=STREAM
    )
    seen: list[str] = []
    after: str | None = None
    while True:
        page = await store.list(limit=3, after=after)
        if not page:
            break
        seen.extend(r.decision.node for r in page)
        after = page[-1].decision.node
    assert seen == names
    with pytest.raises(ValueError, match="limit"):
        await store.list(limit=0)


async def test_reset_forgets_the_projection(migrated_engine: AsyncEngine) -> None:
    store = make_store(migrated_engine)
    await store.apply_decisions([(1, decision("a", T0))], consumer=CONSUMER, stream=STREAM)
    await store.reset(CONSUMER)
    assert await store.offset(CONSUMER) == 0
    assert await store.latest("a") is None and await store.history("a", limit=5) == []
    assert await store.apply_decisions([(1, decision("a", T0))], consumer=CONSUMER, stream=STREAM) == 1


async def test_config_and_node_strategies_are_recorded_and_replaced(migrated_engine: AsyncEngine) -> None:
    store = make_store(migrated_engine)
    assert await store.config() is None and await store.node_strategies() == []

    await store.set_config(config={"enable": False}, error=None, available=True, at=T0)
    await store.set_config(config={"enable": True}, error="invalid colocation-config", available=True, at=T0 + 1)
    config = await store.config()
    assert config is not None
    assert (config.config, config.error, config.available, config.updated_at) == (
        {"enable": True},
        "invalid colocation-config",
        True,
        T0 + 1,
    )

    def strategy(node: str, ratio: int) -> NodeStrategyRecord:
        return NodeStrategyRecord(
            node=node, strategy={"cpuReclaimThresholdPercent": ratio}, node_config="", warnings=("w",), updated_at=T0
        )

    await store.set_node_strategies([strategy("a", 60), strategy("b", 65)])
    await store.set_node_strategies([strategy("a", 70)], removed=["b"])
    (only,) = await store.node_strategies()
    assert (only.node, only.strategy, only.warnings) == ("a", {"cpuReclaimThresholdPercent": 70}, ("w",))


def test_history_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="history_limit"):
        NodeResourceStore(None, history_limit=0)  # type: ignore[arg-type]
