"""Migrations and engine set-up on both backends, plus URL normalization (services.common.db)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.ext.asyncio import AsyncEngine

from migrations import models
from services.common import db

EXPECTED_TABLES = {
    "alembic_version",
    "projection_offsets",
    "node_metrics",
    "nodes",
    "node_resource_decisions",
    "node_resources",
    "colocation_config",
    "node_colocation_strategies",
    "quota_events",
    "quota_profiles",
    "quota_status",
    "quota_trees",
    "migration_jobs",
    "migration_decisions",
}
HEAD = "0004"


async def _tables(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as connection:
        names = await connection.run_sync(lambda sync: sa.inspect(sync).get_table_names())
    return set(names)


async def _revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as connection:
        return await connection.run_sync(lambda sync: MigrationContext.configure(sync).get_current_revision())


async def test_migrations_apply_twice_and_land_on_head(database_url: str) -> None:
    await db.run_migrations(database_url)
    await db.run_migrations(database_url)
    engine = db.create_engine(database_url)
    try:
        assert await _tables(engine) == EXPECTED_TABLES
        assert await _revision(engine) == HEAD
    finally:
        await engine.dispose()


async def test_concurrent_start_ups_migrate_once_without_errors(database_url: str) -> None:
    await asyncio.gather(*(db.run_migrations(database_url) for _ in range(3)))
    engine = db.create_engine(database_url)
    try:
        assert await _revision(engine) == HEAD
    finally:
        await engine.dispose()


async def test_migrated_schema_matches_the_models(migrated_engine: AsyncEngine) -> None:
    def differences(sync: sa.Connection) -> list[Any]:
        context = MigrationContext.configure(sync, opts={"compare_type": True})
        return list(compare_metadata(context, models.metadata()))

    async with migrated_engine.connect() as connection:
        assert await connection.run_sync(differences) == []


def _python(code: str, *args: str) -> str:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True).stdout


def test_migrating_loads_no_service(database_url: str) -> None:
    """Start-up migrates without the stores' models: migrations/env.py loads them for autogenerate only."""
    code = (
        "import asyncio, sys\n"
        "from services.common import db\n"
        "asyncio.run(db.run_migrations(sys.argv[1]))\n"
        "print(sorted(m for m in sys.modules if m.startswith('services.') and not m.startswith('services.common')))"
    )
    assert _python(code, database_url).strip() == "[]"


def test_the_alembic_cli_path_compares_every_store(database_url: str) -> None:
    """What `alembic check` and `alembic revision --autogenerate` run: env.py without a connection, with the models
    migrations.models finds. At head they differ from the database in nothing (a store it missed would show as
    tables to drop)."""
    code = (
        "import sys\n"
        "from alembic import command\n"
        "from services.common import db\n"
        "config = db.alembic_config(sys.argv[1])\n"
        "command.upgrade(config, 'head')\n"
        "command.check(config)\n"
        "print(sorted(m for m in sys.modules if m.endswith('.store')))"
    )
    stores = ["services.migration.store", "services.nodemetric.store", "services.noderesource.store"]
    expected = ["No new upgrade operations detected.", str([*stores, "services.quota.store"])]
    assert _python(code, database_url).splitlines() == expected


async def test_downgrade_to_base_then_upgrade_again(database_url: str) -> None:
    await db.run_migrations(database_url)
    await db.downgrade(database_url, revision="base")
    engine = db.create_engine(database_url)
    try:
        assert await _tables(engine) == {"alembic_version"}
        await db.run_migrations(database_url)
        assert await _tables(engine) == EXPECTED_TABLES
    finally:
        await engine.dispose()


async def test_sqlite_connections_use_wal_foreign_keys_and_busy_timeout(tmp_path: Any) -> None:
    engine = db.create_engine(f"sqlite:///{tmp_path / 'pragmas.db'}")
    try:
        async with engine.connect() as connection:
            journal = (await connection.exec_driver_sql("PRAGMA journal_mode")).scalar_one()
            foreign_keys = (await connection.exec_driver_sql("PRAGMA foreign_keys")).scalar_one()
            busy = (await connection.exec_driver_sql("PRAGMA busy_timeout")).scalar_one()
    finally:
        await engine.dispose()
    assert (journal, foreign_keys, busy) == ("wal", 1, db.SQLITE_BUSY_TIMEOUT_MS)


async def test_sqlite_transactions_roll_back_ddl_and_dml(tmp_path: Any) -> None:
    """sqlite3's legacy mode would autocommit the CREATE TABLE; our BEGIN makes it transactional."""
    engine = db.create_engine(f"sqlite:///{tmp_path / 'tx.db'}")
    try:
        with pytest.raises(RuntimeError):
            async with db.write_transaction(engine) as connection:
                await connection.exec_driver_sql("CREATE TABLE t (x INTEGER)")
                await connection.exec_driver_sql("INSERT INTO t VALUES (1)")
                raise RuntimeError("boom")
        assert await _tables(engine) == set()
    finally:
        await engine.dispose()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:///data/koord.db", "sqlite+aiosqlite:///data/koord.db"),
        ("sqlite:////abs/koord.db", "sqlite+aiosqlite:////abs/koord.db"),
        ("sqlite+aiosqlite:///k.db", "sqlite+aiosqlite:///k.db"),
        ("postgresql://u:p%40ss@db:5432/koord", "postgresql+asyncpg://u:p%40ss@db:5432/koord"),
        ("postgres://u@db/koord", "postgresql+asyncpg://u@db/koord"),
        ("postgresql+asyncpg://u@db/koord", "postgresql+asyncpg://u@db/koord"),
        ("postgresql://u@db/koord?sslmode=require", "postgresql+asyncpg://u@db/koord?ssl=require"),
    ],
)
def test_normalize_url_gives_the_async_driver(url: str, expected: str) -> None:
    assert db.normalize_url(url) == expected


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://u@db/koord", "unsupported database URL scheme 'mysql'"),
        ("postgresql+psycopg://u@db/koord", "unsupported database URL scheme 'postgresql+psycopg'"),
        ("not a url", "not a database URL"),
        ("", "not a database URL"),
    ],
)
def test_normalize_url_rejects_other_databases_with_a_readable_message(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        db.normalize_url(url)


def test_upsert_refuses_unknown_dialects() -> None:
    with pytest.raises(ValueError, match="mysql"):
        db.upsert(db.ProjectionOffset.__table__, dialect_name="mysql", key=["consumer"], update=["last_seq"])
