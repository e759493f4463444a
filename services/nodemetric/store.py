"""The nodemetric projections: latest NodeMetric per node and what each node's agent says about itself.

Written by the nodemetric service (NodeMetricComputed from KOORD_NODEMETRIC; batches seen and
NodeStateReported from KOORD_NODE), read by the API, the k8s writer and later per-node services.
Every write records `(consumer, stream sequence)` in the same transaction as its rows and skips
sequences at or below the recorded offset, so redelivery is a no-op and replaying a stream from the
start rebuilds these tables exactly. Writes are batched: one transaction and one executemany per table.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, cast

import msgspec
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.orm import Mapped, mapped_column

from schemas import vocab
from schemas.node import (
    MetricCollectPolicy,
    NodeMetricComputedRecord,
    NodeMetricStatus,
    NodeStateReported,
    ResourceMap,
)
from services.common import db

DEFAULT_PAGE: Final = 500

# --- tables


class NodeMetricRow(db.Base):
    """Latest computed NodeMetric of a node; `consumer` names the projection that owns the row."""

    __tablename__ = "node_metrics"

    node: Mapped[str] = mapped_column(sa.String(253), primary_key=True)
    report_time: Mapped[float] = mapped_column(sa.Double)
    update_time: Mapped[float] = mapped_column(sa.Double)
    spec: Mapped[str] = mapped_column(sa.Text)
    """msgspec JSON of MetricCollectPolicy."""
    status: Mapped[str] = mapped_column(sa.Text)
    """msgspec JSON of NodeMetricStatus."""
    samples_in_window: Mapped[int] = mapped_column(sa.Integer)
    stream_seq: Mapped[int] = mapped_column(sa.BigInteger)
    msg_id: Mapped[str] = mapped_column(sa.String(200))
    consumer: Mapped[str] = mapped_column(sa.String(200), index=True)


class NodeRow(db.Base):
    """A node as its agent reports it: liveness from metric batches, capacity and cgroup layout from state."""

    __tablename__ = "nodes"

    node: Mapped[str] = mapped_column(sa.String(253), primary_key=True)
    first_seen: Mapped[float] = mapped_column(sa.Double)
    last_seen: Mapped[float] = mapped_column(sa.Double)
    last_batch_seq: Mapped[int] = mapped_column(sa.BigInteger)
    cgroup_version: Mapped[int] = mapped_column(sa.Integer)
    cgroup_driver: Mapped[str] = mapped_column(sa.String(64))
    cpu_cores: Mapped[float] = mapped_column(sa.Double)
    memory_total: Mapped[int] = mapped_column(sa.BigInteger)
    pods: Mapped[int] = mapped_column(sa.Integer)
    agent_version: Mapped[str] = mapped_column(sa.String(100))
    dropped_batches: Mapped[int] = mapped_column(sa.BigInteger)
    consumer: Mapped[str] = mapped_column(sa.String(200), index=True)


# Declarative types __table__ as a FromClause; these are plain Tables.
_METRICS: Final = cast(sa.Table, NodeMetricRow.__table__)
_NODES: Final = cast(sa.Table, NodeRow.__table__)

# --- values handed to and returned from the store


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeSeen:
    """A metrics batch arrived from `node`: its window end (event time) and the batches its agent dropped before it."""

    node: str
    window_end: float
    dropped_batches: int = 0


_NodeEvent = NodeSeen | NodeStateReported
"""What the node-stream projector hands over: metric batches seen and state reports."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeMetricRecord:
    node: str
    report_time: float
    update_time: float
    spec: MetricCollectPolicy
    status: NodeMetricStatus
    samples_in_window: int
    stream_seq: int
    msg_id: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeRecord:
    node: str
    first_seen: float
    last_seen: float
    """Newest event time heard from the node: a batch's window_end or a state report's `at`."""
    last_batch_seq: int
    cgroup_version: int
    cgroup_driver: str
    cpu_cores: float
    memory_total: int
    pods: int
    agent_version: str
    dropped_batches: int
    """Sum of the dropped-batch counts the agent attached to its batches."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class UsageSummary:
    """A NodeMetric boiled down for an overview row: the node's usage and its batch and mid pods' usage."""

    node: str
    report_time: float
    cpu: int | None
    """Node usage, millicores; None when the NodeMetric carries no node usage."""
    memory: int | None
    """Node usage, bytes."""
    batch_cpu: int
    """Σ usage of the pods with priority koord-batch, millicores (likewise below)."""
    batch_memory: int
    mid_cpu: int
    mid_memory: int
    pods: int = 0
    """The pods the NodeMetric names (podsMetric): those the node's agent measured in the report's window."""


class _PodUsageView(msgspec.Struct, frozen=True, kw_only=True):
    pod_usage: ResourceMap
    priority: str = ""


class _NodeUsageView(msgspec.Struct, frozen=True, kw_only=True):
    node_usage: ResourceMap


class _StatusUsageView(msgspec.Struct, frozen=True, kw_only=True):
    """The parts of a stored NodeMetricStatus an overview needs; msgspec skips the rest without building it."""

    node_metric: _NodeUsageView
    pods_metric: list[_PodUsageView] = []


_encoder: Final = msgspec.json.Encoder()
_status_decoder: Final = msgspec.json.Decoder(NodeMetricStatus)
_spec_decoder: Final = msgspec.json.Decoder(MetricCollectPolicy)
_usage_decoder: Final = msgspec.json.Decoder(_StatusUsageView)


class NodeMetricStore:
    """Async access to the nodemetric projections on one engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    # --- writes

    async def apply_computed(
        self,
        items: Sequence[tuple[int, NodeMetricComputedRecord]],
        *,
        consumer: str,
        stream: str,
        msg_ids: Mapping[int, str] | None = None,
    ) -> int:
        """Project (stream seq, event) pairs; returns the rows written.

        Already-projected sequences are skipped; an event whose report_time is older than the stored
        one for its node never replaces it. `msg_ids` maps a sequence to its Nats-Msg-Id, when known.
        """

        async def write(connection: AsyncConnection, fresh: builtins.list[tuple[int, NodeMetricComputedRecord]]) -> int:
            stored = await _stored_report_times(connection, {event.node for _, event in fresh})
            newest = _newest_per_node(fresh, stored)
            if newest:
                rows = [_metric_row(seq, event, consumer=consumer, msg_ids=msg_ids) for seq, event in newest]
                await connection.execute(_upsert_metrics(connection.dialect.name), rows)
            return len(newest)

        return await db.project_batch(
            self._engine, items, consumer=consumer, stream=stream, write=write, event_time=_latest_report
        )

    async def apply_node_events(
        self,
        items: Sequence[tuple[int, _NodeEvent]],
        *,
        consumer: str,
        stream: str,
        partition: Callable[[str], int] | None = None,
    ) -> int:
        """Project one consumer's node-stream batch (metric batches seen and state reports) in one transaction.

        Use this when both kinds share a consumer: applying them in two calls would let the first call's
        offset hide the other kind's lower sequences. With `partition` (a node's partition of the stream), each
        partition's rows are tracked under their own offset, `<consumer>.p<partition>`, whoever writes them: the
        replica that takes a partition over replays it from further back than its other partitions' offsets (one
        offset for all of them skipped the replayed rows for good). Returns the node rows written.
        """

        async def write(connection: AsyncConnection, fresh: builtins.list[tuple[int, _NodeEvent]]) -> int:
            seen = [(seq, item) for seq, item in fresh if isinstance(item, NodeSeen)]
            states = [(seq, item) for seq, item in fresh if isinstance(item, NodeStateReported)]
            # Seen and state rows touch disjoint columns except first/last_seen (min/max): order does not matter.
            seen_rows = _seen_rows(seen, consumer=consumer)
            if seen_rows:
                await connection.execute(_upsert_seen(connection.dialect.name), seen_rows)
            state_rows = _state_rows(states, consumer=consumer)
            if state_rows:
                await connection.execute(_upsert_state(connection.dialect.name), state_rows)
            return len({row["node"] for row in (*seen_rows, *state_rows)})

        return await db.project_batch(
            self._engine,
            items,
            consumer=consumer,
            stream=stream,
            write=write,
            event_time=_latest_node_event,
            offset_of=None if partition is None else functools.partial(_partition_offset, consumer, partition),
        )

    async def apply_node_seen(self, items: Sequence[tuple[int, NodeSeen]], *, consumer: str, stream: str) -> int:
        """Record metric batches per node (liveness, last batch seq, dropped batches); returns the nodes written."""
        return await self.apply_node_events(items, consumer=consumer, stream=stream)

    async def apply_node_state(
        self, items: Sequence[tuple[int, NodeStateReported]], *, consumer: str, stream: str
    ) -> int:
        """Record each node's reported capacity and cgroup layout (last report per node wins); returns nodes written."""
        return await self.apply_node_events(items, consumer=consumer, stream=stream)

    async def reset(self, consumer: str) -> None:
        """Forget everything `consumer` projected (its offsets, its partitions' too, and its rows) so a replay can
        rebuild it."""
        async with db.write_transaction(self._engine) as connection:
            await connection.execute(sa.delete(_METRICS).where(_METRICS.c.consumer == consumer))
            await connection.execute(sa.delete(_NODES).where(_NODES.c.consumer == consumer))
            await db.delete_offset(connection, consumer, with_partitions=True)

    # --- reads

    async def get(self, node: str) -> NodeMetricRecord | None:
        async with self._engine.connect() as connection:
            result = await connection.execute(sa.select(_METRICS).where(_METRICS.c.node == node))
            row = result.mappings().one_or_none()
        return _metric_record(row) if row is not None else None

    async def list(self, *, limit: int = DEFAULT_PAGE, after: str | None = None) -> builtins.list[NodeMetricRecord]:
        """NodeMetrics ordered by node name; pass the last name of a page as `after` to get the next page."""
        rows = await self._page(_METRICS, limit=limit, after=after)
        return [_metric_record(row) for row in rows]

    async def nodes(self, *, limit: int = DEFAULT_PAGE, after: str | None = None) -> builtins.list[NodeRecord]:
        """Known nodes ordered by name, paged like `list`."""
        rows = await self._page(_NODES, limit=limit, after=after)
        return [_node_record(row) for row in rows]

    async def nodes_by_name(self, names: Iterable[str]) -> builtins.list[NodeRecord]:
        """The known nodes among `names`, ordered by name (unknown names are left out)."""
        wanted = sorted(set(names))
        if not wanted:
            return []
        query = sa.select(_NODES).where(_NODES.c.node.in_(wanted)).order_by(_NODES.c.node)
        async with self._engine.connect() as connection:
            return [_node_record(row) for row in (await connection.execute(query)).mappings()]

    async def usage_summaries(self, *, after: str | None, through: str) -> builtins.list[UsageSummary]:
        """The NodeMetrics of the nodes named in (after, through], ordered by name, as overview summaries (the
        dashboard pages the node list by name and fetches the same name range here)."""
        query = sa.select(_METRICS.c.node, _METRICS.c.report_time, _METRICS.c.status).where(_METRICS.c.node <= through)
        if after is not None:
            query = query.where(_METRICS.c.node > after)
        async with self._engine.connect() as connection:
            rows = (await connection.execute(query.order_by(_METRICS.c.node))).all()
        return [_usage_summary(row.node, float(row.report_time), row.status) for row in rows]

    async def usage_summaries_of(self, names: Iterable[str]) -> builtins.list[UsageSummary]:
        """The NodeMetrics of the nodes among `names` that have one, ordered by name, as overview summaries."""
        wanted = sorted(set(names))
        if not wanted:
            return []
        query = sa.select(_METRICS.c.node, _METRICS.c.report_time, _METRICS.c.status).where(_METRICS.c.node.in_(wanted))
        async with self._engine.connect() as connection:
            rows = (await connection.execute(query.order_by(_METRICS.c.node))).all()
        return [_usage_summary(row.node, float(row.report_time), row.status) for row in rows]

    async def offset(self, consumer: str) -> int:
        async with self._engine.connect() as connection:
            return await db.read_offset(connection, consumer)

    async def last_report_times(self) -> dict[str, float]:
        """report_time of every stored NodeMetric; nodemetric uses it to resume its report schedule."""
        async with self._engine.connect() as connection:
            result = await connection.execute(sa.select(_METRICS.c.node, _METRICS.c.report_time))
            return {node: float(report_time) for node, report_time in result}

    async def _page(self, table: sa.Table, *, limit: int, after: str | None) -> builtins.list[sa.RowMapping]:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        query = sa.select(table).order_by(table.c.node).limit(limit)
        if after is not None:
            query = query.where(table.c.node > after)
        async with self._engine.connect() as connection:
            return builtins.list((await connection.execute(query)).mappings())


# --- transaction steps


async def _stored_report_times(connection: AsyncConnection, nodes: set[str]) -> dict[str, float]:
    query = sa.select(_METRICS.c.node, _METRICS.c.report_time).where(_METRICS.c.node.in_(sorted(nodes)))
    return {node: float(report_time) for node, report_time in await connection.execute(query)}


# --- pure row building


def _newest_per_node(
    fresh: Sequence[tuple[int, NodeMetricComputedRecord]], stored: Mapping[str, float]
) -> builtins.list[tuple[int, NodeMetricComputedRecord]]:
    """One event per node: the newest report, ties going to the later sequence; none older than what is stored."""
    newest: dict[str, tuple[int, NodeMetricComputedRecord]] = {}
    for seq, event in fresh:
        if event.report_time < stored.get(event.node, float("-inf")):
            continue
        current = newest.get(event.node)
        if current is None or event.report_time >= current[1].report_time:
            newest[event.node] = (seq, event)
    return builtins.list(newest.values())


def _latest_node_event(fresh: Sequence[tuple[int, _NodeEvent]]) -> float:
    return max(item.window_end if isinstance(item, NodeSeen) else item.at for _, item in fresh)


def _partition_offset(consumer: str, partition: Callable[[str], int], item: _NodeEvent) -> str:
    return f"{consumer}.p{partition(item.node)}"


def _latest_report(fresh: Sequence[tuple[int, NodeMetricComputedRecord]]) -> float:
    return max(event.report_time for _, event in fresh)


def _metric_row(
    seq: int, event: NodeMetricComputedRecord, *, consumer: str, msg_ids: Mapping[int, str] | None
) -> dict[str, Any]:
    return {
        "node": event.node,
        "report_time": event.report_time,
        "update_time": event.update_time,
        "spec": _encoder.encode(event.spec).decode(),
        "status": bytes(event.status).decode(),
        "samples_in_window": event.samples_in_window,
        "stream_seq": seq,
        "msg_id": (msg_ids or {}).get(seq, ""),
        "consumer": consumer,
    }


def _seen_rows(fresh: Sequence[tuple[int, NodeSeen]], *, consumer: str) -> builtins.list[dict[str, Any]]:
    """Fold a batch into one row per node: ON CONFLICT may touch a row only once per statement on PostgreSQL."""
    rows: dict[str, dict[str, Any]] = {}
    for seq, seen in fresh:
        row = rows.get(seen.node)
        if row is None:
            rows[seen.node] = {
                **_blank_node(seen.node, consumer=consumer),
                "first_seen": seen.window_end,
                "last_seen": seen.window_end,
                "last_batch_seq": seq,
                "dropped_batches": seen.dropped_batches,
            }
            continue
        row["first_seen"] = min(row["first_seen"], seen.window_end)
        row["last_seen"] = max(row["last_seen"], seen.window_end)
        row["last_batch_seq"] = max(row["last_batch_seq"], seq)
        row["dropped_batches"] += seen.dropped_batches
    return builtins.list(rows.values())


def _state_rows(fresh: Sequence[tuple[int, NodeStateReported]], *, consumer: str) -> builtins.list[dict[str, Any]]:
    """One row per node: the last report's fields, with first/last seen spanning all of the node's reports."""
    rows: dict[str, dict[str, Any]] = {}
    for _, state in fresh:
        previous = rows.get(state.node)
        row = _state_row(state, consumer=consumer)
        if previous is not None:
            row["first_seen"] = min(previous["first_seen"], state.at)
            row["last_seen"] = max(previous["last_seen"], state.at)
        rows[state.node] = row
    return builtins.list(rows.values())


def _state_row(state: NodeStateReported, *, consumer: str) -> dict[str, Any]:
    return {
        **_blank_node(state.node, consumer=consumer),
        "first_seen": state.at,
        "last_seen": state.at,
        "cgroup_version": state.cgroup_version,
        "cgroup_driver": state.cgroup_driver,
        "cpu_cores": state.cpu_cores,
        "memory_total": state.memory_total,
        "pods": len(state.pods),
        "agent_version": state.agent_version,
    }


def _blank_node(node: str, *, consumer: str) -> dict[str, Any]:
    return {
        "node": node,
        "first_seen": 0.0,
        "last_seen": 0.0,
        "last_batch_seq": 0,
        "cgroup_version": 0,
        "cgroup_driver": "",
        "cpu_cores": 0.0,
        "memory_total": 0,
        "pods": 0,
        "agent_version": "",
        "dropped_batches": 0,
        "consumer": consumer,
    }


# --- statements (built per dialect; SQL stays portable through db.upsert)


def _upsert_metrics(dialect_name: str) -> sa.Insert:
    columns = ["report_time", "update_time", "spec", "status", "samples_in_window", "stream_seq", "msg_id", "consumer"]
    return db.upsert(
        _METRICS,
        dialect_name=dialect_name,
        key=["node"],
        update=columns,
        # Re-checked in SQL so a concurrent writer's newer report still wins.
        where=lambda excluded: _METRICS.c.report_time <= excluded.report_time,
    )


def _upsert_seen(dialect_name: str) -> sa.Insert:
    def merge(excluded: db.Excluded) -> dict[str, Any]:
        return {
            "first_seen": _least(_NODES.c.first_seen, excluded.first_seen),
            "last_seen": _greatest(_NODES.c.last_seen, excluded.last_seen),
            "last_batch_seq": _greatest(_NODES.c.last_batch_seq, excluded.last_batch_seq),
            "dropped_batches": _NODES.c.dropped_batches + excluded.dropped_batches,
            "consumer": excluded.consumer,
        }

    return db.upsert(_NODES, dialect_name=dialect_name, key=["node"], update=merge)


def _upsert_state(dialect_name: str) -> sa.Insert:
    def merge(excluded: db.Excluded) -> dict[str, Any]:
        reported = ["cgroup_version", "cgroup_driver", "cpu_cores", "memory_total", "pods", "agent_version"]
        return {
            **{name: excluded[name] for name in reported},
            "first_seen": _least(_NODES.c.first_seen, excluded.first_seen),
            "last_seen": _greatest(_NODES.c.last_seen, excluded.last_seen),
            "consumer": excluded.consumer,
        }

    return db.upsert(_NODES, dialect_name=dialect_name, key=["node"], update=merge)


# GREATEST/LEAST are PostgreSQL-only and SQLite's max()/min() are not; CASE works on both.
def _greatest(stored: Any, incoming: Any) -> sa.ColumnElement[Any]:
    return sa.case((stored >= incoming, stored), else_=incoming)


def _least(stored: Any, incoming: Any) -> sa.ColumnElement[Any]:
    return sa.case((stored <= incoming, stored), else_=incoming)


# --- decoding


def _metric_record(row: sa.RowMapping) -> NodeMetricRecord:
    return NodeMetricRecord(
        node=row["node"],
        report_time=float(row["report_time"]),
        update_time=float(row["update_time"]),
        spec=_spec_decoder.decode(row["spec"]),
        status=_status_decoder.decode(row["status"]),
        samples_in_window=int(row["samples_in_window"]),
        stream_seq=int(row["stream_seq"]),
        msg_id=row["msg_id"],
    )


def _node_record(row: sa.RowMapping) -> NodeRecord:
    # Column names equal field names, and both drivers already return float/int/str for these types.
    return NodeRecord(**{field.name: row[field.name] for field in dataclasses.fields(NodeRecord)})


def _usage_summary(node: str, report_time: float, status_json: str) -> UsageSummary:
    view = _usage_decoder.decode(status_json)
    sums = {(vocab.PRIORITY_BATCH, "cpu"): 0, (vocab.PRIORITY_BATCH, "memory"): 0}
    sums |= {(vocab.PRIORITY_MID, "cpu"): 0, (vocab.PRIORITY_MID, "memory"): 0}
    for pod in view.pods_metric:
        if pod.priority in (vocab.PRIORITY_BATCH, vocab.PRIORITY_MID):
            for resource in ("cpu", "memory"):
                sums[pod.priority, resource] += pod.pod_usage.resources.get(resource, 0)
    usage = view.node_metric.node_usage.resources
    return UsageSummary(
        node=node,
        report_time=report_time,
        cpu=usage.get("cpu"),
        memory=usage.get("memory"),
        batch_cpu=sums[vocab.PRIORITY_BATCH, "cpu"],
        batch_memory=sums[vocab.PRIORITY_BATCH, "memory"],
        mid_cpu=sums[vocab.PRIORITY_MID, "cpu"],
        mid_memory=sums[vocab.PRIORITY_MID, "memory"],
        pods=len(view.pods_metric),
    )
