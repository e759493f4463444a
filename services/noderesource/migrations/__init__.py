"""The noderesource store's alembic revisions, part of one linear schema history with migrations/versions and
the other services' migrations/ directories (services.common.db.alembic_config lists them as version locations)."""
