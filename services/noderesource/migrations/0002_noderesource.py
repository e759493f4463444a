"""noderesource projections: decision history, latest decision per node, the colocation config, node strategies.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "node_resource_decisions",
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("stream_seq", sa.BigInteger(), nullable=False),
        sa.Column("computed_at", sa.Double(), nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("write_due", sa.Boolean(), nullable=False),
        sa.Column("write_reason", sa.Text(), nullable=False),
        sa.Column("resources", sa.Text(), nullable=False),
        sa.Column("decision", sa.Text(), nullable=False),
        sa.Column("msg_id", sa.String(200), nullable=False),
        sa.Column("consumer", sa.String(200), nullable=False),
        sa.PrimaryKeyConstraint("node", "stream_seq", name=op.f("pk_node_resource_decisions")),
    )
    op.create_index("ix_node_resource_decisions_node_computed_at", "node_resource_decisions", ["node", "computed_at"])
    op.create_index(op.f("ix_node_resource_decisions_consumer"), "node_resource_decisions", ["consumer"])
    op.create_table(
        "node_resources",
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("computed_at", sa.Double(), nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("resources", sa.Text(), nullable=False),
        sa.Column("last_write_at", sa.Double(), nullable=True),
        sa.Column("last_write_resources", sa.Text(), nullable=False),
        sa.Column("decision", sa.Text(), nullable=False),
        sa.Column("stream_seq", sa.BigInteger(), nullable=False),
        sa.Column("consumer", sa.String(200), nullable=False),
        sa.PrimaryKeyConstraint("node", name=op.f("pk_node_resources")),
    )
    op.create_index(op.f("ix_node_resources_consumer"), "node_resources", ["consumer"])
    op.create_table(
        "colocation_config",
        sa.Column("key", sa.String(300), nullable=False),
        sa.Column("config", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("available", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_colocation_config")),
    )
    op.create_table(
        "node_colocation_strategies",
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("strategy", sa.Text(), nullable=False),
        sa.Column("node_config", sa.String(253), nullable=False),
        sa.Column("warnings", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("node", name=op.f("pk_node_colocation_strategies")),
    )


def downgrade() -> None:
    op.drop_table("node_colocation_strategies")
    op.drop_table("colocation_config")
    op.drop_index(op.f("ix_node_resources_consumer"), table_name="node_resources")
    op.drop_table("node_resources")
    op.drop_index(op.f("ix_node_resource_decisions_consumer"), table_name="node_resource_decisions")
    op.drop_index("ix_node_resource_decisions_node_computed_at", table_name="node_resource_decisions")
    op.drop_table("node_resource_decisions")
