"""`koordbus db upgrade`: bring the database schema to this version (the migration step of a deployment)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from koordbus.common import add_common, common_settings, require


def add_parser(sub: Any) -> None:
    db = sub.add_parser(
        "db",
        help="database schema: bring it to this version (the migration step of a deployment)",
        description="upgrade: apply every alembic migration the database lacks (idempotent; concurrent runs "
        "serialize on a lock). Services also migrate at start; a deployment runs this once before them.",
    )
    db.add_argument("action", choices=["upgrade"], help="what to do")
    add_common(db, embedded=False)
    db.set_defaults(run=lambda a: asyncio.run(run_db(a)))


async def run_db(args: argparse.Namespace) -> int:
    from koordbus import runtime
    from services.common import db

    common = common_settings(args)
    runtime.configure_logging(args.log_level or common.log_level, args.log_format or common.log_format)
    url = require(common.database_url, "--database-url")
    await db.run_migrations(url)
    from sqlalchemy.engine import make_url

    shown = make_url(url).render_as_string(hide_password=True)
    print(f"koordbus db: {shown} is at the newest schema", flush=True)
    return 0
