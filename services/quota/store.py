"""The quota projections: every quota event (history), the profiles, and each quota's and tree's latest status.

Written by the quota service's two projectors (services.quota.service): KOORD_QUOTA events become `quota_events`
rows (the history behind GET /api/v1/quotas/{name}/history; an event that cannot be decoded is kept as an
"unreadable" row so the history shows the gap) and `quota_profiles` rows; KOORD_QUOTA_STATUS statuses become
`quota_status` and `quota_trees` rows (what GET /api/v1/quotas and /api/v1/quota-trees serve, so reads work while
the quota service is down). Each projector records its stream offset in the same transaction as its rows and skips
sequences at or below it, so redelivery is a no-op and a fresh database replays both streams. Read by
services.quota.routes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Final, cast

import msgspec
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.orm import Mapped, mapped_column

from schemas import quota_events as ev
from schemas.quota_service import QuotaStatusComputed, QuotaStatusEvent, QuotaTreeComputed
from services.common import db


class QuotaEventRow(db.Base):
    __tablename__ = "quota_events"
    __table_args__ = (sa.Index("ix_quota_events_name_seq", "name", "stream_seq"),)

    stream_seq: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(253), primary_key=True)
    """The quota's (or profile's) name; empty for an unreadable event. An import has a row per quota."""
    tree: Mapped[str] = mapped_column(sa.String(253))
    type: Mapped[str] = mapped_column(sa.String(64))
    actor: Mapped[str] = mapped_column(sa.String(253))
    time: Mapped[float] = mapped_column(sa.Double)
    command_id: Mapped[str] = mapped_column(sa.String(200))
    event: Mapped[str] = mapped_column(sa.Text)
    """The event's JSON as stored in the stream."""


class QuotaProfileRow(db.Base):
    __tablename__ = "quota_profiles"

    name: Mapped[str] = mapped_column(sa.String(253), primary_key=True)
    tree: Mapped[str] = mapped_column(sa.String(253))
    profile: Mapped[str] = mapped_column(sa.Text)
    stream_seq: Mapped[int] = mapped_column(sa.BigInteger)


class QuotaStatusRow(db.Base):
    __tablename__ = "quota_status"

    name: Mapped[str] = mapped_column(sa.String(253), primary_key=True)
    tree: Mapped[str] = mapped_column(sa.String(253), index=True)
    status: Mapped[str] = mapped_column(sa.Text)
    """msgspec JSON of the QuotaStatusComputed."""
    stream_seq: Mapped[int] = mapped_column(sa.BigInteger)


class QuotaTreeRow(db.Base):
    __tablename__ = "quota_trees"

    tree: Mapped[str] = mapped_column(sa.String(253), primary_key=True)
    status: Mapped[str] = mapped_column(sa.Text)
    """msgspec JSON of the QuotaTreeComputed."""
    stream_seq: Mapped[int] = mapped_column(sa.BigInteger)


_EVENTS: Final = cast(sa.Table, QuotaEventRow.__table__)
_PROFILES: Final = cast(sa.Table, QuotaProfileRow.__table__)
_STATUS: Final = cast(sa.Table, QuotaStatusRow.__table__)
_TREES: Final = cast(sa.Table, QuotaTreeRow.__table__)
_STATUS_DECODER: Final = msgspec.json.Decoder(QuotaStatusComputed)
_TREE_DECODER: Final = msgspec.json.Decoder(QuotaTreeComputed)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StoredEvent:
    """One event of the log as projected."""

    stream_seq: int
    tree: str
    name: str
    type: str
    actor: str
    time: float
    command_id: str
    event: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LoggedEvent:
    """What the events projector hands over: the stored bytes and, when they decode, the event."""

    stream_seq: int
    tree: str
    data: bytes
    event: ev.QuotaEvent | None


def _event_rows(item: LoggedEvent) -> list[dict[str, Any]]:
    """One history row per object the event carries (an import carries many; an unreadable event gets one)."""
    event = item.event
    text = item.data.decode("utf-8", errors="replace")
    base = {"stream_seq": item.stream_seq, "tree": item.tree, "event": text}
    if event is None:
        return [{**base, "name": "", "type": "unreadable", "actor": "", "time": 0.0, "command_id": ""}]
    match event:
        case ev.QuotaCreated(quota=obj) | ev.QuotaUpdated(quota=obj) | ev.QuotaDeleted(quota=obj):
            names = [obj.metadata.name]
        case ev.QuotasImported(quotas=objs):
            names = [obj.metadata.name for obj in objs]
        case ev.ProfileCreated(profile=p) | ev.ProfileUpdated(profile=p) | ev.ProfileDeleted(profile=p):
            names = [p.metadata.name]
    common = {
        "type": str(event.__struct_config__.tag),
        "actor": event.actor,
        "time": event.time.timestamp(),
        "command_id": event.command_id,
    }
    return [{**base, **common, "name": name} for name in names]


class QuotaStore:
    """Async access to the quota projections on one engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def offset(self, consumer: str) -> int:
        async with self._engine.connect() as connection:
            return await db.read_offset(connection, consumer)

    # --- writes

    async def apply_events(self, items: Sequence[LoggedEvent], *, consumer: str, stream: str) -> int:
        """Project a batch of the log in one transaction; returns the events written."""
        pairs = [(item.stream_seq, item) for item in items]
        return await db.project_batch(self._engine, pairs, consumer=consumer, stream=stream, write=_write_events)

    async def apply_statuses(self, items: Sequence[tuple[int, QuotaStatusEvent]], *, consumer: str, stream: str) -> int:
        """Project a batch of statuses (latest per quota and tree wins) in one transaction."""
        return await db.project_batch(self._engine, items, consumer=consumer, stream=stream, write=_write_statuses)

    # --- reads

    async def quota(self, name: str) -> QuotaStatusComputed | None:
        async with self._engine.connect() as connection:
            text = (await connection.execute(sa.select(_STATUS.c.status).where(_STATUS.c.name == name))).scalar()
        return None if text is None else _STATUS_DECODER.decode(text)

    async def quotas(self, *, tree: str | None = None) -> list[QuotaStatusComputed]:
        query = sa.select(_STATUS.c.status).order_by(_STATUS.c.name)
        if tree is not None:
            query = query.where(_STATUS.c.tree == tree)
        async with self._engine.connect() as connection:
            rows = (await connection.execute(query)).scalars().all()
        return [_STATUS_DECODER.decode(text) for text in rows]

    async def tree(self, tree: str) -> QuotaTreeComputed | None:
        async with self._engine.connect() as connection:
            text = (await connection.execute(sa.select(_TREES.c.status).where(_TREES.c.tree == tree))).scalar()
        return None if text is None else _TREE_DECODER.decode(text)

    async def trees(self) -> list[QuotaTreeComputed]:
        async with self._engine.connect() as connection:
            rows = (await connection.execute(sa.select(_TREES.c.status).order_by(_TREES.c.tree))).scalars().all()
        return [_TREE_DECODER.decode(text) for text in rows]

    async def history(self, name: str, *, limit: int) -> list[StoredEvent]:
        """The quota's (or profile's) events, newest first."""
        query = sa.select(_EVENTS).where(_EVENTS.c.name == name).order_by(_EVENTS.c.stream_seq.desc()).limit(limit)
        async with self._engine.connect() as connection:
            rows = (await connection.execute(query)).mappings().all()
        return [
            StoredEvent(
                stream_seq=row["stream_seq"],
                tree=row["tree"],
                name=row["name"],
                type=row["type"],
                actor=row["actor"],
                time=row["time"],
                command_id=row["command_id"],
                event=msgspec.json.decode(row["event"]),
            )
            for row in rows
        ]

    async def profiles(self) -> list[dict[str, Any]]:
        async with self._engine.connect() as connection:
            rows = (await connection.execute(sa.select(_PROFILES.c.profile).order_by(_PROFILES.c.name))).scalars()
            return [msgspec.json.decode(text) for text in rows.all()]


# --- transaction steps (services.common.db.project_batch runs them)


async def _write_events(connection: AsyncConnection, fresh: list[tuple[int, LoggedEvent]]) -> int:
    await connection.execute(sa.insert(_EVENTS), [row for _, item in fresh for row in _event_rows(item)])
    upsert = db.upsert(
        _PROFILES, dialect_name=connection.dialect.name, key=["name"], update=["tree", "profile", "stream_seq"]
    )
    for _, item in fresh:
        match item.event:
            case ev.ProfileCreated(profile=p) | ev.ProfileUpdated(profile=p):
                row = {
                    "name": p.metadata.name,
                    "tree": item.tree,
                    "profile": msgspec.json.encode(p).decode(),
                    "stream_seq": item.stream_seq,
                }
                await connection.execute(upsert, [row])
            case ev.ProfileDeleted(profile=p):
                await connection.execute(sa.delete(_PROFILES).where(_PROFILES.c.name == p.metadata.name))
    return len(fresh)


async def _write_statuses(connection: AsyncConnection, fresh: list[tuple[int, QuotaStatusEvent]]) -> int:
    """The latest status per quota and per tree of the batch wins."""
    quotas: dict[str, dict[str, Any]] = {}
    trees: dict[str, dict[str, Any]] = {}
    for seq, status in fresh:
        text = msgspec.json.encode(status).decode()
        if isinstance(status, QuotaStatusComputed):
            quotas[status.quota] = {"name": status.quota, "tree": status.tree, "status": text, "stream_seq": seq}
        else:
            trees[status.tree] = {"tree": status.tree, "status": text, "stream_seq": seq}
    dialect = connection.dialect.name
    gone = [name for name, row in quotas.items() if _STATUS_DECODER.decode(row["status"]).deleted]
    live = [row for name, row in quotas.items() if name not in gone]
    if gone:
        await connection.execute(sa.delete(_STATUS).where(_STATUS.c.name.in_(gone)))
    if live:
        statement = db.upsert(_STATUS, dialect_name=dialect, key=["name"], update=["tree", "status", "stream_seq"])
        await connection.execute(statement, live)
    if trees:
        statement = db.upsert(_TREES, dialect_name=dialect, key=["tree"], update=["status", "stream_seq"])
        await connection.execute(statement, list(trees.values()))
    return len(fresh)
