"""Initial schema: projection tracking and the nodemetric projections.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "projection_offsets",
        sa.Column("consumer", sa.String(200), nullable=False),
        sa.Column("stream", sa.String(200), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_event", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("consumer", name=op.f("pk_projection_offsets")),
    )
    op.create_table(
        "node_metrics",
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("report_time", sa.Double(), nullable=False),
        sa.Column("update_time", sa.Double(), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("samples_in_window", sa.Integer(), nullable=False),
        sa.Column("stream_seq", sa.BigInteger(), nullable=False),
        sa.Column("msg_id", sa.String(200), nullable=False),
        sa.Column("consumer", sa.String(200), nullable=False),
        sa.PrimaryKeyConstraint("node", name=op.f("pk_node_metrics")),
    )
    op.create_index(op.f("ix_node_metrics_consumer"), "node_metrics", ["consumer"])
    op.create_table(
        "nodes",
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("first_seen", sa.Double(), nullable=False),
        sa.Column("last_seen", sa.Double(), nullable=False),
        sa.Column("last_batch_seq", sa.BigInteger(), nullable=False),
        sa.Column("cgroup_version", sa.Integer(), nullable=False),
        sa.Column("cgroup_driver", sa.String(64), nullable=False),
        sa.Column("cpu_cores", sa.Double(), nullable=False),
        sa.Column("memory_total", sa.BigInteger(), nullable=False),
        sa.Column("pods", sa.Integer(), nullable=False),
        sa.Column("agent_version", sa.String(100), nullable=False),
        sa.Column("dropped_batches", sa.BigInteger(), nullable=False),
        sa.Column("consumer", sa.String(200), nullable=False),
        sa.PrimaryKeyConstraint("node", name=op.f("pk_nodes")),
    )
    op.create_index(op.f("ix_nodes_consumer"), "nodes", ["consumer"])


def downgrade() -> None:
    op.drop_index(op.f("ix_nodes_consumer"), table_name="nodes")
    op.drop_table("nodes")
    op.drop_index(op.f("ix_node_metrics_consumer"), table_name="node_metrics")
    op.drop_table("node_metrics")
    op.drop_table("projection_offsets")
