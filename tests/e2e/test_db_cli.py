"""`koordbus db upgrade`: the deployment's migration step, as a real process, on SQLite and PostgreSQL; running it
twice changes nothing; without a database URL it says what is missing."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
import sqlalchemy as sa

from services.common import db

pytestmark = pytest.mark.e2e


def _upgrade(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "koordbus.cli", "db", "upgrade", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_db_upgrade_brings_a_fresh_database_to_the_newest_schema(database_url: str) -> None:
    for _ in range(2):
        done = _upgrade("--database-url", database_url)
        assert done.returncode == 0, done.stderr
        assert "is at the newest schema" in done.stdout
    assert {"alembic_version", "node_metrics", "quota_events", "migration_jobs"} <= asyncio.run(_tables(database_url))


async def _tables(url: str) -> set[str]:
    engine = db.create_engine(url)
    try:
        async with engine.connect() as connection:
            return set(await connection.run_sync(lambda sync: sa.inspect(sync).get_table_names()))
    finally:
        await engine.dispose()


def test_db_upgrade_without_a_database_url_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KOORDBUS_DATABASE_URL", raising=False)
    done = _upgrade()
    assert done.returncode != 0 and "--database-url is required" in done.stderr + done.stdout
