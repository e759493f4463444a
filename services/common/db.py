"""Database plumbing shared by every service's store: URLs, engines, migrations, the model base and tracking.

`koordbus up` and each service's start-up call `normalize_url`, `run_migrations` and `create_engine`;
stores (`services/*/store.py`) declare their tables on `Base`, write through `write_transaction`, build
dialect-neutral upserts with `upsert`, and project each batch with `project_batch`, which skips what they
already have and records what they projected (`read_offset` / `record_offset`) in the same transaction as the rows,
so redelivery is a no-op and replaying a stream rebuilds a projection exactly.
One schema serves SQLite (aiosqlite, the embedded default) and PostgreSQL (asyncpg, clusters).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import logging
import os
import sqlite3
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final, TypeVar, cast

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

log = logging.getLogger(__name__)

Item = TypeVar("Item")

SQLITE_DRIVER: Final = "sqlite+aiosqlite"
POSTGRES_DRIVER: Final = "postgresql+asyncpg"
SQLITE_BUSY_TIMEOUT_MS: Final = 10_000

_DRIVERS: Final[Mapping[str, str]] = {
    "sqlite": SQLITE_DRIVER,
    "sqlite+aiosqlite": SQLITE_DRIVER,
    "postgresql": POSTGRES_DRIVER,
    "postgres": POSTGRES_DRIVER,
    "postgresql+asyncpg": POSTGRES_DRIVER,
}

# Explicit constraint names keep later alembic revisions (and SQLite batch mode) able to find them.
NAMING_CONVENTION: Final[dict[str, str]] = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Connection execution option that asks for a SQLite write lock at BEGIN (see `write_transaction`).
_WRITE_OPTION: Final = "koordbus_write"
# Arbitrary constant key: concurrent start-ups against one PostgreSQL database migrate one at a time.
_MIGRATION_LOCK_KEY: Final = 0x6B6F6F7264  # "koord"


class Base(DeclarativeBase):
    """Declarative base of every koordbus table; one MetaData so alembic sees the whole schema."""

    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


class ProjectionOffset(Base):
    """How far a consumer has projected its stream: the tracking half of every projection write."""

    __tablename__ = "projection_offsets"

    consumer: Mapped[str] = mapped_column(sa.String(200), primary_key=True)
    stream: Mapped[str] = mapped_column(sa.String(200))
    last_seq: Mapped[int] = mapped_column(sa.BigInteger)
    updated_at_event: Mapped[float] = mapped_column(sa.Double)
    """Event time of the newest event in the last applied batch (never the wall clock, so replays match)."""


# --- URLs and engines


def normalize_url(url: str) -> str:
    """The async-driver form of a SQLite or PostgreSQL URL; anything else raises ValueError with a readable reason."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ValueError(f"not a database URL: {url!r} (expected sqlite:///path or postgresql://…)") from exc
    driver = _DRIVERS.get(parsed.drivername)
    if driver is None:
        supported = ", ".join(sorted(_DRIVERS))
        raise ValueError(f"unsupported database URL scheme {parsed.drivername!r}; use one of: {supported}")
    parsed = parsed.set(drivername=driver)
    if driver == POSTGRES_DRIVER:
        parsed = _asyncpg_query(parsed)
    return parsed.render_as_string(hide_password=False)


def _asyncpg_query(url: URL) -> URL:
    """asyncpg spells libpq's `sslmode` as `ssl`; accept the libpq spelling people paste from elsewhere."""
    if "sslmode" not in url.query:
        return url
    query = dict(url.query)
    query["ssl"] = query.pop("sslmode")
    return url.set(query=query)


def create_engine(url: str, *, echo: bool = False) -> AsyncEngine:
    """An async engine for `url` (normalized first). Call at start-up, never at import; dispose it at shutdown."""
    normalized = normalize_url(url)
    if make_url(normalized).get_backend_name() == "sqlite":
        engine = create_async_engine(normalized, echo=echo)
        _install_sqlite_hooks(engine)
        return engine
    return create_async_engine(
        normalized, echo=echo, pool_size=5, max_overflow=10, pool_pre_ping=True, pool_recycle=1800
    )


def _enable_wal(cursor: Any) -> None:
    """Switch the database file to WAL (a persistent property of the file, so usually already done).

    Converting needs an exclusive lock and SQLite answers "database is locked" at once, busy timeout or not, when
    another connection holds one — typically another start-up converting the same new file. That connection's
    conversion is as good as ours, and a database left in rollback-journal mode is still correct (the next
    connection tries again), so a locked conversion is not an error.
    """
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
    except sqlite3.OperationalError as e:
        if "locked" not in str(e):
            raise
        log.debug("sqlite: journal_mode=WAL deferred, the database is locked by another connection")


def _install_sqlite_hooks(engine: AsyncEngine) -> None:
    """WAL, foreign keys and a busy timeout per connection; SQLAlchemy (not sqlite3) emits BEGIN.

    sqlite3's legacy mode skips BEGIN for SELECT and DDL, which breaks read-then-write atomicity and
    transactional migrations; with `isolation_level = None` we emit BEGIN ourselves. Write transactions
    use BEGIN IMMEDIATE so two writers queue on the busy timeout instead of failing on lock upgrade.
    """

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            _enable_wal(cursor)
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
        finally:
            cursor.close()

    def on_begin(connection: sa.Connection) -> None:
        immediate = connection.get_execution_options().get(_WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    sa.event.listen(engine.sync_engine, "connect", on_connect)
    sa.event.listen(engine.sync_engine, "begin", on_begin)


_sqlite_writers: weakref.WeakKeyDictionary[AsyncEngine, asyncio.Lock] = weakref.WeakKeyDictionary()


@asynccontextmanager
async def write_transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection inside one transaction that commits on success and rolls back on any exception.

    On SQLite the transaction takes the write lock up front, so a read-check-write sequence (offset,
    then rows) cannot be overtaken by another writer between its read and its first write. The engine's
    writers take turns, first come first served, before asking SQLite: its busy wait polls at intervals,
    so a writer committing batch after batch (a projector replaying a backfill) kept another from the lock
    past the busy timeout ("database is locked" at BEGIN IMMEDIATE under load, with every service of
    `koordbus up` on one engine). The busy timeout is left to writers in other processes.
    """
    turn: contextlib.AbstractAsyncContextManager[object] = contextlib.nullcontext()
    if engine.dialect.name == "sqlite":
        turn = _sqlite_writers.setdefault(engine, asyncio.Lock())
    async with turn, engine.connect() as connection:
        await connection.execution_options(**{_WRITE_OPTION: True})
        async with connection.begin():
            yield connection


# --- upserts and tracking


def _offsets() -> sa.Table:
    return cast(sa.Table, ProjectionOffset.__table__)


Excluded = Any
"""The `excluded` pseudo-table of an INSERT … ON CONFLICT statement (dialect-specific column collection)."""


def upsert(
    table: sa.Table,
    *,
    dialect_name: str,
    key: Sequence[str],
    update: Sequence[str] | Callable[[Excluded], Mapping[str, Any]],
    where: Callable[[Excluded], sa.ColumnElement[bool]] | None = None,
) -> sa.Insert:
    """INSERT … ON CONFLICT (key) DO UPDATE for SQLite or PostgreSQL; execute it with a list of rows.

    `update` names the columns to overwrite from the incoming row, or builds the SET clause from
    `excluded` (the incoming row) and the table's own columns (the stored row). `where` guards the
    update, e.g. "only when the incoming event is newer".
    """
    statement: sqlite.Insert | postgresql.Insert
    if dialect_name == "sqlite":
        statement = sqlite.insert(table)
    elif dialect_name == "postgresql":
        statement = postgresql.insert(table)
    else:
        raise ValueError(f"upsert supports sqlite and postgresql, not {dialect_name!r}")
    excluded = statement.excluded
    set_ = {name: excluded[name] for name in update} if isinstance(update, Sequence) else dict(update(excluded))
    return statement.on_conflict_do_update(
        index_elements=list(key), set_=set_, where=where(excluded) if where is not None else None
    )


async def read_offset(connection: AsyncConnection, consumer: str, *, lock: bool = False) -> int:
    """The last stream sequence `consumer` projected (0 when it never did).

    With `lock`, PostgreSQL holds the offset row until commit, so two replicas of one consumer apply a
    batch one after the other (SQLite already serializes through BEGIN IMMEDIATE).
    """
    offsets = _offsets()
    query = sa.select(offsets.c.last_seq).where(offsets.c.consumer == consumer)
    if lock:
        query = query.with_for_update()
    value = (await connection.execute(query)).scalar_one_or_none()
    return int(value) if value is not None else 0


async def record_offset(
    connection: AsyncConnection, *, consumer: str, stream: str, last_seq: int, event_time: float
) -> None:
    """Move `consumer`'s offset forward to `last_seq` (never backwards) in the caller's transaction."""
    offsets = _offsets()
    statement = upsert(
        offsets,
        dialect_name=connection.dialect.name,
        key=["consumer"],
        update=["stream", "last_seq", "updated_at_event"],
        where=lambda excluded: offsets.c.last_seq < excluded.last_seq,
    )
    await connection.execute(
        statement, [{"consumer": consumer, "stream": stream, "last_seq": last_seq, "updated_at_event": event_time}]
    )


async def delete_offset(connection: AsyncConnection, consumer: str, *, with_partitions: bool = False) -> None:
    """Forget `consumer`'s offset; `with_partitions`: its per-partition offsets too (`<consumer>.p<n>`)."""
    offsets = _offsets()
    matches = offsets.c.consumer == consumer
    if with_partitions:
        matches = matches | offsets.c.consumer.startswith(f"{consumer}.p", autoescape=True)
    await connection.execute(sa.delete(offsets).where(matches))


def _no_event_time(fresh: Sequence[tuple[int, Any]]) -> float:
    return 0.0


async def project_batch(
    engine: AsyncEngine,
    items: Iterable[tuple[int, Item]],
    *,
    consumer: str,
    stream: str,
    write: Callable[[AsyncConnection, list[tuple[int, Item]]], Awaitable[int]],
    event_time: Callable[[list[tuple[int, Item]]], float] = _no_event_time,
    offset_of: Callable[[Item], str] | None = None,
) -> int:
    """Project one batch of (stream sequence, item) pairs in one transaction, skipping what is already projected.

    The one shape of every store's projector write: `consumer`'s offset is read under lock, pairs at or below it
    are dropped, and a sequence given twice (a redelivered message queued twice before a write) is kept once; the
    rest go to `write` in stream order, with the transaction's connection; then the offset moves to their last
    sequence, with `event_time` of them (0.0 when not given). Returns what `write` returns; 0 when nothing was
    new (`write` is not called and the offsets stay).

    `offset_of` names the offset each item is tracked under instead (one per partition of a partitioned stream,
    whose partitions move between replicas: a replica taking a partition over replays it from before the
    partition's own offset, which its other partitions' offsets are already past). The offsets are locked in
    name order, so two writers never wait on each other in a cycle.
    """
    groups: dict[str, dict[int, Item]] = {}
    for seq, item in items:
        groups.setdefault(consumer if offset_of is None else offset_of(item), {})[seq] = item
    async with write_transaction(engine) as connection:
        advanced: dict[str, list[tuple[int, Item]]] = {}
        for name in sorted(groups):
            offset = await read_offset(connection, name, lock=True)
            fresh = sorted(((seq, item) for seq, item in groups[name].items() if seq > offset), key=_by_sequence)
            if fresh:
                advanced[name] = fresh
        if not advanced:
            return 0
        written = await write(connection, sorted((p for f in advanced.values() for p in f), key=_by_sequence))
        for name, fresh in advanced.items():
            await record_offset(
                connection, consumer=name, stream=stream, last_seq=fresh[-1][0], event_time=event_time(fresh)
            )
        return written


def _by_sequence(pair: tuple[int, object]) -> int:
    return pair[0]


# --- migrations


def version_locations() -> list[Path]:
    """Where the alembic revisions are: migrations/versions, then every services/<name>/migrations directory."""
    services_dir = Path(str(importlib.resources.files("services")))
    found = sorted(d for d in services_dir.glob("*/migrations") if d.is_dir())
    return [Path(str(importlib.resources.files("migrations"))) / "versions", *found]


def alembic_config(url: str) -> Config:
    """Alembic configured in code: the environment is the installed `migrations` package, no alembic.ini needed.

    The revisions are one linear history spread over version locations: the base in migrations/versions (the shared
    projection_offsets table with nodemetric's first tables), then each store's in its service's `migrations/`
    directory (services/<name>/migrations), found on disk here so that neither this module nor migrations/env.py
    imports a service. A new revision goes where its store is: `alembic revision --version-path
    services/<name>/migrations`."""
    config = Config()
    config.set_main_option("script_location", str(importlib.resources.files("migrations")))
    config.set_main_option("path_separator", "os")  # os.pathsep: a path may hold spaces
    config.set_main_option("version_locations", os.pathsep.join(str(p) for p in version_locations()))
    # ConfigParser interpolates '%'; URL-encoded passwords contain it.
    config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return config


async def run_migrations(url: str, *, revision: str = "head") -> None:
    """Bring the database at `url` to `revision` (default: head). Idempotent; safe inside a running loop.

    The upgrade runs on our own async connection through `run_sync`, so alembic's env.py never starts
    an event loop of its own; concurrent start-ups serialize on a lock (advisory on PostgreSQL, the
    write lock on SQLite) and the later ones find nothing to do.
    """
    engine = create_engine(url)
    try:
        async with write_transaction(engine) as connection:
            if connection.dialect.name == "postgresql":
                await connection.execute(sa.select(sa.func.pg_advisory_xact_lock(_MIGRATION_LOCK_KEY)))
            await connection.run_sync(_upgrade, alembic_config(url), revision)
    finally:
        await engine.dispose()


async def downgrade(url: str, *, revision: str) -> None:
    """Take the database back to `revision` ("base" drops everything); for tests and operators' rollbacks."""
    engine = create_engine(url)
    try:
        async with write_transaction(engine) as connection:
            await connection.run_sync(_downgrade, alembic_config(url), revision)
    finally:
        await engine.dispose()


def _upgrade(connection: sa.Connection, config: Config, revision: str) -> None:
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


def _downgrade(connection: sa.Connection, config: Config, revision: str) -> None:
    config.attributes["connection"] = connection
    command.downgrade(config, revision)
