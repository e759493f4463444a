"""The whole schema as the stores declare it: the target of `alembic revision --autogenerate` and `alembic check`
(migrations/env.py) and of the test that the migrated schema matches the models (tests/integration/test_migrations.py).

Each service's `store.py` declares its tables on services.common.db.Base; `metadata()` imports every
`services.<name>.store` there is (found with pkgutil, so no service is named here) and returns Base's MetaData.
Migrating needs none of it: the revisions (migrations/versions/ and each services/<name>/migrations/) spell out
their tables themselves.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

import sqlalchemy as sa

import services
from services.common import db


def metadata() -> sa.MetaData:
    for package in pkgutil.iter_modules(services.__path__):
        store = f"services.{package.name}.store"
        if package.ispkg and importlib.util.find_spec(store) is not None:
            importlib.import_module(store)
    return db.Base.metadata
