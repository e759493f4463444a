"""Alembic environment for koordbus: run by `services.common.db.run_migrations` / `downgrade` (and the alembic CLI).

In the programmatic path the caller hands us a live synchronous connection (an async connection's
`run_sync`), so we migrate on it without owning a loop. From the alembic CLI there is no connection;
we then open our own async engine and drive it with `asyncio.run`, which is safe only there.

Migrating compares nothing, so the programmatic path (start-up, `koordbus db`, the Helm job) loads no model. The
alembic CLI gets the whole schema as the stores declare it (migrations.models, which finds them without naming
a service), which `alembic revision --autogenerate` and `alembic check` compare the database with.
"""

from __future__ import annotations

import asyncio

import sqlalchemy as sa
from alembic import context

from migrations import models
from services.common import db


def _configure_and_run(connection: sa.Connection, target_metadata: sa.MetaData | None) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode lets later revisions stay portable.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_with_own_engine(url: str) -> None:
    engine = db.create_engine(url)
    try:
        async with db.write_transaction(engine) as connection:
            await connection.run_sync(_configure_and_run, models.metadata())
    finally:
        await engine.dispose()


def _run_offline(url: str) -> None:
    context.configure(url=url, target_metadata=models.metadata(), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def _main() -> None:
    connection = context.config.attributes.get("connection")
    url = context.config.get_main_option("sqlalchemy.url") or ""
    if context.is_offline_mode():
        _run_offline(url)
    elif connection is not None:
        _configure_and_run(connection, None)
    else:
        asyncio.run(_run_with_own_engine(url))


_main()
