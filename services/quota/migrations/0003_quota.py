"""quota projections: the event history, profiles, each quota's and tree's latest status.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "quota_events",
        sa.Column("stream_seq", sa.BigInteger(), nullable=False),
        sa.Column("tree", sa.String(253), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("actor", sa.String(253), nullable=False),
        sa.Column("time", sa.Double(), nullable=False),
        sa.Column("command_id", sa.String(200), nullable=False),
        sa.Column("event", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("stream_seq", "name", name=op.f("pk_quota_events")),
    )
    op.create_index("ix_quota_events_name_seq", "quota_events", ["name", "stream_seq"])
    op.create_table(
        "quota_profiles",
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("tree", sa.String(253), nullable=False),
        sa.Column("profile", sa.Text(), nullable=False),
        sa.Column("stream_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_quota_profiles")),
    )
    op.create_table(
        "quota_status",
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("tree", sa.String(253), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("stream_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_quota_status")),
    )
    op.create_index(op.f("ix_quota_status_tree"), "quota_status", ["tree"])
    op.create_table(
        "quota_trees",
        sa.Column("tree", sa.String(253), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("stream_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tree", name=op.f("pk_quota_trees")),
    )


def downgrade() -> None:
    op.drop_table("quota_trees")
    op.drop_index(op.f("ix_quota_status_tree"), table_name="quota_status")
    op.drop_table("quota_status")
    op.drop_table("quota_profiles")
    op.drop_index("ix_quota_events_name_seq", table_name="quota_events")
    op.drop_table("quota_events")
