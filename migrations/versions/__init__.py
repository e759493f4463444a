"""Alembic revisions, one file per schema change, applied in order by services.common.db.run_migrations."""
