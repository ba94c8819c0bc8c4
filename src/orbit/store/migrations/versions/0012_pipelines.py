"""pipelines and bulk control: run_dependencies (a run's `after:`, one row per run it waits for,
indexed by that run so that its end finds who waits for it), attempts.held (the gate that holds
a prepared attempt back: `after`, its dependencies), and a node's reason for being out of
service (drain or cordon --reason), who gave it and when

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_dependencies",
        sa.Column("run_id", sa.String(40), sa.ForeignKey("runs.id"), primary_key=True),
        sa.Column("needs", sa.String(40), primary_key=True),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
    )
    op.create_index("ix_run_dependencies_needs", "run_dependencies", ["needs"])
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("held", sa.String(16), nullable=True))
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("reason", sa.Text, nullable=True))
        batch.add_column(sa.Column("reason_by", sa.String(128), nullable=True))
        batch.add_column(sa.Column("reason_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("reason_at")
        batch.drop_column("reason_by")
        batch.drop_column("reason")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("held")
    op.drop_index("ix_run_dependencies_needs", "run_dependencies")
    op.drop_table("run_dependencies")
