"""migration projections: jobs with their arbitration outcome and phase, and each job's decision trail.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "migration_jobs",
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("pod", sa.String(253), nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("workload", sa.String(253), nullable=False),
        sa.Column("phase", sa.String(32), nullable=False),
        sa.Column("arbitration", sa.String(32), nullable=False),
        sa.Column("reason", sa.String(253), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("actor", sa.String(253), nullable=False),
        sa.Column("requested_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_migration_jobs")),
    )
    op.create_index("ix_migration_jobs_phase", "migration_jobs", ["phase"])
    op.create_index(op.f("ix_migration_jobs_namespace"), "migration_jobs", ["namespace"])
    op.create_index(op.f("ix_migration_jobs_node"), "migration_jobs", ["node"])
    op.create_index(op.f("ix_migration_jobs_workload"), "migration_jobs", ["workload"])
    op.create_table(
        "migration_decisions",
        sa.Column("stream_seq", sa.BigInteger(), nullable=False),
        sa.Column("job", sa.String(253), nullable=False),
        sa.Column("round", sa.BigInteger(), nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("filter", sa.String(253), nullable=False),
        sa.Column("reason", sa.String(253), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("time", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("stream_seq", "job", name=op.f("pk_migration_decisions")),
    )
    op.create_index(op.f("ix_migration_decisions_job"), "migration_decisions", ["job"])


def downgrade() -> None:
    op.drop_index(op.f("ix_migration_decisions_job"), table_name="migration_decisions")
    op.drop_table("migration_decisions")
    for column in ("workload", "node", "namespace"):
        op.drop_index(op.f(f"ix_migration_jobs_{column}"), table_name="migration_jobs")
    op.drop_index("ix_migration_jobs_phase", table_name="migration_jobs")
    op.drop_table("migration_jobs")
