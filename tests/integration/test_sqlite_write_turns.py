"""db.write_transaction on one SQLite engine: writers take turns. SQLite's busy wait polls for the lock at intervals,
so a writer committing transaction after transaction (a projector replaying a backfill under `koordbus up`) kept
another one out past the busy timeout — "database is locked" at BEGIN IMMEDIATE, and a projector's flush failed with
a traceback in `up`'s output (tests/e2e/test_up_simcluster.py under two test suites at a time)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from services.common import db


async def test_a_writer_is_not_held_off_by_another_committing_back_to_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db, "SQLITE_BUSY_TIMEOUT_MS", 1000)  # read by each new connection
    url = f"sqlite:///{tmp_path / 'koordbus.db'}"
    await db.run_migrations(url)
    engine = db.create_engine(url)
    busy_until = time.monotonic() + 3.0  # three busy timeouts of back-to-back transactions
    hog_transactions = 0

    async def hog() -> None:
        nonlocal hog_transactions
        while time.monotonic() < busy_until:
            async with db.write_transaction(engine) as connection:
                await connection.execute(sa.text("SELECT 1"))
                await asyncio.sleep(0.02)  # holding the write lock
            hog_transactions += 1

    async def one_write() -> int:
        await asyncio.sleep(0.3)  # the hog is at it
        async with db.write_transaction(engine) as connection:  # old code: "database is locked" after 1 s
            await connection.execute(sa.text("SELECT 1"))
        return hog_transactions

    try:
        _, before = await asyncio.gather(hog(), one_write())
    finally:
        await engine.dispose()
    # its turn came while the hog went on: it did not wait for the hog to stop
    assert 0 < before < hog_transactions, (before, hog_transactions)
