"""who runs what where, and the live scheduler config: indexes for `runs list --user` (runs by
their submitter, newest first) and `--node` (attempts by their target: a host, a cluster, a
pinned node; pool attempts by node_id, indexed already), and sched_config, the one row that
holds the scheduler config last seen valid (its text, digest, source, who set it and when)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_runs_created_by_created_at", "runs", ["created_by", "created_at"])
    op.create_index("ix_attempts_target", "attempts", ["target"])
    op.create_table(
        "sched_config",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("source", sa.String(1024), nullable=False),
        sa.Column("set_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("set_by", sa.String(128), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("sched_config")
    op.drop_index("ix_attempts_target", "attempts")
    op.drop_index("ix_runs_created_by_created_at", "runs")
