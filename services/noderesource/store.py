"""The noderesource projections: every batch/mid decision per node, the latest one, and the colocation config.

Written by services.noderesource.service: its projector consumer applies NodeResourceComputed events from
KOORD_NODERESOURCE (`apply_decisions`), recording `(consumer, stream sequence)` in the same transaction and
skipping sequences already projected, so redelivery is a no-op and a replay from the start rebuilds the tables;
and the service records the effective colocation config and each node's effective strategy when they change
(`set_config`, `set_node_strategies`), which are current state, not projections of a stream. Read by
services.noderesource.routes. History is capped per node (`history_limit`), pruned in the same transaction.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

import msgspec
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.orm import Mapped, mapped_column

from schemas.noderesource import NODERESOURCE_COMPUTED_DECODER, NodeResourceComputed
from services.common import db

DEFAULT_PAGE: Final = 500
DEFAULT_HISTORY_LIMIT: Final = 100
COLOCATION_CONFIG_KEY: Final = "koordinator-system/slo-controller-config"
"""The one row of `colocation_config`: the ConfigMap it was read from."""

# --- tables


class NodeResourceDecisionRow(db.Base):
    """One published decision of one node (the newest `history_limit` per node are kept)."""

    __tablename__ = "node_resource_decisions"
    __table_args__ = (sa.Index("ix_node_resource_decisions_node_computed_at", "node", "computed_at"),)

    node: Mapped[str] = mapped_column(sa.String(253), primary_key=True)
    stream_seq: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True)
    computed_at: Mapped[float] = mapped_column(sa.Double)
    outcome: Mapped[str] = mapped_column(sa.String(32))
    write_due: Mapped[bool] = mapped_column(sa.Boolean)
    write_reason: Mapped[str] = mapped_column(sa.Text)
    resources: Mapped[str] = mapped_column(sa.Text)
    """JSON: resource name → amount, null when the resource is removed."""
    decision: Mapped[str] = mapped_column(sa.Text)
    """msgspec JSON of the whole NodeResourceComputed event."""
    msg_id: Mapped[str] = mapped_column(sa.String(200))
    consumer: Mapped[str] = mapped_column(sa.String(200), index=True)


class NodeResourceRow(db.Base):
    """The latest decision of a node (by computed_at; an older event never replaces it)."""

    __tablename__ = "node_resources"

    node: Mapped[str] = mapped_column(sa.String(253), primary_key=True)
    computed_at: Mapped[float] = mapped_column(sa.Double)
    outcome: Mapped[str] = mapped_column(sa.String(32))
    reason: Mapped[str] = mapped_column(sa.Text)
    resources: Mapped[str] = mapped_column(sa.Text)
    last_write_at: Mapped[float | None] = mapped_column(sa.Double, nullable=True)
    last_write_resources: Mapped[str] = mapped_column(sa.Text)
    decision: Mapped[str] = mapped_column(sa.Text)
    stream_seq: Mapped[int] = mapped_column(sa.BigInteger)
    consumer: Mapped[str] = mapped_column(sa.String(200), index=True)


class ColocationConfigRow(db.Base):
    """The colocation config in effect (Koordinator JSON), why the ConfigMap's content is not, and availability."""

    __tablename__ = "colocation_config"

    key: Mapped[str] = mapped_column(sa.String(300), primary_key=True)
    config: Mapped[str] = mapped_column(sa.Text)
    error: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    available: Mapped[bool] = mapped_column(sa.Boolean)
    updated_at: Mapped[float] = mapped_column(sa.Double)


class NodeColocationStrategyRow(db.Base):
    """A node's effective colocation strategy (cluster → nodeConfigs entry → annotation → labels)."""

    __tablename__ = "node_colocation_strategies"

    node: Mapped[str] = mapped_column(sa.String(253), primary_key=True)
    strategy: Mapped[str] = mapped_column(sa.Text)
    node_config: Mapped[str] = mapped_column(sa.String(253))
    warnings: Mapped[str] = mapped_column(sa.Text)
    """JSON list of strings."""
    updated_at: Mapped[float] = mapped_column(sa.Double)


_DECISIONS: Final = cast(sa.Table, NodeResourceDecisionRow.__table__)
_LATEST: Final = cast(sa.Table, NodeResourceRow.__table__)
_CONFIG: Final = cast(sa.Table, ColocationConfigRow.__table__)
_STRATEGIES: Final = cast(sa.Table, NodeColocationStrategyRow.__table__)

# --- values handed to and returned from the store


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DecisionRecord:
    """A stored decision and where it sits in the stream."""

    decision: NodeResourceComputed
    stream_seq: int
    msg_id: str = ""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LatestResources:
    """A node's latest batch/mid resources without the rest of the decision."""

    node: str
    computed_at: float
    outcome: str
    resources: dict[str, int | None]
    """Resource name → amount (millicores, bytes); None: removed."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ColocationConfigRecord:
    config: dict[str, Any]
    """The effective config as services.noderesource.config.config_to_json renders it."""
    error: str | None
    available: bool
    updated_at: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeStrategyRecord:
    node: str
    strategy: dict[str, Any]
    """As services.noderesource.config.strategy_to_json renders it."""
    node_config: str
    warnings: tuple[str, ...]
    updated_at: float


_encoder: Final = msgspec.json.Encoder()
_json_decoder: Final = msgspec.json.Decoder()


class NodeResourceStore:
    """Async access to the noderesource projections on one engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: AsyncEngine, *, history_limit: int = DEFAULT_HISTORY_LIMIT) -> None:
        if history_limit < 1:
            raise ValueError(f"history_limit must be at least 1, got {history_limit}")
        self._engine = engine
        self._history_limit = history_limit

    # --- writes

    async def apply_decisions(
        self,
        items: Sequence[tuple[int, NodeResourceComputed]],
        *,
        consumer: str,
        stream: str,
        msg_ids: Mapping[int, str] | None = None,
    ) -> int:
        """Project (stream seq, decision) pairs in one transaction; returns the history rows written.

        Sequences at or below the consumer's offset are skipped. Each decision becomes a history row; the latest
        row per node is replaced only by a decision computed at the same time or later. Each touched node keeps
        its newest `history_limit` history rows.
        """
        ids = msg_ids or {}

        async def write(connection: AsyncConnection, fresh: builtins.list[tuple[int, NodeResourceComputed]]) -> int:
            history = [_history_row(seq, event, msg_id=ids.get(seq, ""), consumer=consumer) for seq, event in fresh]
            await connection.execute(sa.insert(_DECISIONS), history)
            await connection.execute(
                _upsert_latest(connection.dialect.name),
                [_latest_row(seq, event, consumer=consumer) for seq, event in _newest_per_node(fresh)],
            )
            await self._prune(connection, {event.node for _, event in fresh})
            return len(history)

        return await db.project_batch(
            self._engine, items, consumer=consumer, stream=stream, write=write, event_time=_latest_decision
        )

    async def _prune(self, connection: AsyncConnection, nodes: set[str]) -> None:
        """Delete the touched nodes' history rows older than their newest `history_limit`, in one statement."""
        newer = _DECISIONS.alias("newer")
        oldest_kept = (
            sa.select(newer.c.stream_seq)
            .where(newer.c.node == _DECISIONS.c.node)
            .order_by(newer.c.stream_seq.desc())
            .limit(1)
            .offset(self._history_limit - 1)
            .scalar_subquery()
        )
        await connection.execute(
            sa.delete(_DECISIONS).where(_DECISIONS.c.node.in_(sorted(nodes)), _DECISIONS.c.stream_seq < oldest_kept)
        )

    async def set_config(self, *, config: Mapping[str, Any], error: str | None, available: bool, at: float) -> None:
        """Record the colocation config in effect, the ConfigMap error (if any) and whether a config was loaded."""
        row = {
            "key": COLOCATION_CONFIG_KEY,
            "config": _encoder.encode(config).decode(),
            "error": error,
            "available": available,
            "updated_at": at,
        }
        async with db.write_transaction(self._engine) as connection:
            statement = db.upsert(
                _CONFIG,
                dialect_name=connection.dialect.name,
                key=["key"],
                update=["config", "error", "available", "updated_at"],
            )
            await connection.execute(statement, [row])

    async def set_node_strategies(
        self, strategies: Sequence[NodeStrategyRecord], *, removed: Sequence[str] = ()
    ) -> None:
        """Record the effective strategies of some nodes and forget the `removed` nodes', in one transaction."""
        async with db.write_transaction(self._engine) as connection:
            if strategies:
                statement = db.upsert(
                    _STRATEGIES,
                    dialect_name=connection.dialect.name,
                    key=["node"],
                    update=["strategy", "node_config", "warnings", "updated_at"],
                )
                await connection.execute(statement, [_strategy_row(record) for record in strategies])
            if removed:
                await connection.execute(sa.delete(_STRATEGIES).where(_STRATEGIES.c.node.in_(sorted(removed))))

    async def reset(self, consumer: str) -> None:
        """Forget what `consumer` projected (its offset, history and latest rows) so a replay can rebuild it."""
        async with db.write_transaction(self._engine) as connection:
            await connection.execute(sa.delete(_DECISIONS).where(_DECISIONS.c.consumer == consumer))
            await connection.execute(sa.delete(_LATEST).where(_LATEST.c.consumer == consumer))
            await db.delete_offset(connection, consumer)

    # --- reads

    async def offset(self, consumer: str) -> int:
        async with self._engine.connect() as connection:
            return await db.read_offset(connection, consumer)

    async def latest(self, node: str) -> DecisionRecord | None:
        """The node's latest decision, None when none was projected."""
        async with self._engine.connect() as connection:
            query = sa.select(_LATEST.c.decision, _LATEST.c.stream_seq).where(_LATEST.c.node == node)
            row = (await connection.execute(query)).one_or_none()
        return None if row is None else _record(row.decision, row.stream_seq)

    async def history(self, node: str, *, limit: int) -> builtins.list[DecisionRecord]:
        """The node's newest `limit` decisions, newest (highest stream sequence) first."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        query = (
            sa.select(_DECISIONS.c.decision, _DECISIONS.c.stream_seq, _DECISIONS.c.msg_id)
            .where(_DECISIONS.c.node == node)
            .order_by(_DECISIONS.c.stream_seq.desc())
            .limit(limit)
        )
        async with self._engine.connect() as connection:
            rows = (await connection.execute(query)).all()
        return [_record(row.decision, row.stream_seq, row.msg_id) for row in rows]

    async def list(self, *, limit: int = DEFAULT_PAGE, after: str | None = None) -> builtins.list[DecisionRecord]:
        """Latest decisions ordered by node name; pass the last name of a page as `after` for the next page."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        query = sa.select(_LATEST.c.decision, _LATEST.c.stream_seq).order_by(_LATEST.c.node).limit(limit)
        if after is not None:
            query = query.where(_LATEST.c.node > after)
        async with self._engine.connect() as connection:
            rows = (await connection.execute(query)).all()
        return [_record(row.decision, row.stream_seq) for row in rows]

    async def resources_between(self, *, after: str | None, through: str) -> builtins.list[LatestResources]:
        """The latest resources of the nodes named in (after, through], ordered by name, without decoding whole
        decisions (the dashboard's overview pages nodes by name)."""
        columns = (_LATEST.c.node, _LATEST.c.computed_at, _LATEST.c.outcome, _LATEST.c.resources)
        query = sa.select(*columns).where(_LATEST.c.node <= through)
        if after is not None:
            query = query.where(_LATEST.c.node > after)
        async with self._engine.connect() as connection:
            rows = (await connection.execute(query.order_by(_LATEST.c.node))).all()
        return [
            LatestResources(
                node=row.node,
                computed_at=float(row.computed_at),
                outcome=row.outcome,
                resources=_json_decoder.decode(row.resources),
            )
            for row in rows
        ]

    async def config(self) -> ColocationConfigRecord | None:
        """The recorded colocation config, None before the service recorded one."""
        async with self._engine.connect() as connection:
            query = sa.select(_CONFIG).where(_CONFIG.c.key == COLOCATION_CONFIG_KEY)
            row = (await connection.execute(query)).mappings().one_or_none()
        if row is None:
            return None
        return ColocationConfigRecord(
            config=_json_decoder.decode(row["config"]),
            error=row["error"],
            available=bool(row["available"]),
            updated_at=float(row["updated_at"]),
        )

    async def node_strategies(self) -> builtins.list[NodeStrategyRecord]:
        """Every recorded node strategy, ordered by node name."""
        async with self._engine.connect() as connection:
            rows = (await connection.execute(sa.select(_STRATEGIES).order_by(_STRATEGIES.c.node))).mappings().all()
        return [
            NodeStrategyRecord(
                node=row["node"],
                strategy=_json_decoder.decode(row["strategy"]),
                node_config=row["node_config"],
                warnings=tuple(_json_decoder.decode(row["warnings"])),
                updated_at=float(row["updated_at"]),
            )
            for row in rows
        ]


# --- pure row building


def _newest_per_node(
    fresh: Sequence[tuple[int, NodeResourceComputed]],
) -> builtins.list[tuple[int, NodeResourceComputed]]:
    """One decision per node (ON CONFLICT may touch a row once per statement): the latest computed, ties to the
    later sequence."""
    newest: dict[str, tuple[int, NodeResourceComputed]] = {}
    for seq, event in fresh:
        held = newest.get(event.node)
        if held is None or event.computed_at >= held[1].computed_at:
            newest[event.node] = (seq, event)
    return builtins.list(newest.values())


def _latest_decision(fresh: Sequence[tuple[int, NodeResourceComputed]]) -> float:
    return max(event.computed_at for _, event in fresh)


def _history_row(seq: int, event: NodeResourceComputed, *, msg_id: str, consumer: str) -> dict[str, Any]:
    return {
        "node": event.node,
        "stream_seq": seq,
        "computed_at": event.computed_at,
        "outcome": event.outcome,
        "write_due": event.write_due,
        "write_reason": event.write_reason,
        "resources": _encoder.encode(event.resources).decode(),
        "decision": _encoder.encode(event).decode(),
        "msg_id": msg_id,
        "consumer": consumer,
    }


def _latest_row(seq: int, event: NodeResourceComputed, *, consumer: str) -> dict[str, Any]:
    return {
        "node": event.node,
        "computed_at": event.computed_at,
        "outcome": event.outcome,
        "reason": event.reason,
        "resources": _encoder.encode(event.resources).decode(),
        "last_write_at": event.last_write_at,
        "last_write_resources": _encoder.encode(event.last_write_resources).decode(),
        "decision": _encoder.encode(event).decode(),
        "stream_seq": seq,
        "consumer": consumer,
    }


def _strategy_row(record: NodeStrategyRecord) -> dict[str, Any]:
    return {
        "node": record.node,
        "strategy": _encoder.encode(record.strategy).decode(),
        "node_config": record.node_config,
        "warnings": _encoder.encode(builtins.list(record.warnings)).decode(),
        "updated_at": record.updated_at,
    }


def _upsert_latest(dialect_name: str) -> sa.Insert:
    columns = [
        "computed_at",
        "outcome",
        "reason",
        "resources",
        "last_write_at",
        "last_write_resources",
        "decision",
        "stream_seq",
        "consumer",
    ]
    return db.upsert(
        _LATEST,
        dialect_name=dialect_name,
        key=["node"],
        update=columns,
        # Re-checked in SQL: a replayed or late older decision never replaces a newer one.
        where=lambda excluded: _LATEST.c.computed_at <= excluded.computed_at,
    )


def _record(decision: str, stream_seq: int, msg_id: str = "") -> DecisionRecord:
    return DecisionRecord(
        decision=NODERESOURCE_COMPUTED_DECODER.decode(decision), stream_seq=int(stream_seq), msg_id=msg_id
    )
