"""Alembic migrations for koordbus's projection database (one schema for SQLite and PostgreSQL)."""
