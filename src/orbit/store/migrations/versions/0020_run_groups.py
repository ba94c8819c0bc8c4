"""run groups: a sweep makes its runs as one group (run_groups), and each run names it

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_groups",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("experiment_id", sa.String(40), sa.ForeignKey("experiments.id"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("sweep", sa.JSON, nullable=False),
    )
    op.create_index("ix_run_groups_experiment_id", "run_groups", ["experiment_id"])
    op.create_index("ix_run_groups_created_at", "run_groups", ["created_at"])
    op.create_index("ix_run_groups_created_by", "run_groups", ["created_by"])
    # a plain ADD COLUMN on SQLite too (a batch copy would drop the table attempts refer to),
    # with its reference written inline, which SQLite takes and Alembic would not
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE runs ADD COLUMN group_id VARCHAR(40) REFERENCES run_groups (id)")
    else:
        op.add_column("runs", sa.Column("group_id", sa.String(40), nullable=True))
        op.create_foreign_key(None, "runs", "run_groups", ["group_id"], ["id"])
    op.create_index("ix_runs_group_id", "runs", ["group_id"])


def downgrade() -> None:
    op.drop_index("ix_runs_group_id", "runs")
    if op.get_bind().dialect.name != "sqlite":
        op.drop_constraint("runs_group_id_fkey", "runs", type_="foreignkey")
    op.drop_column("runs", "group_id")  # SQLite >= 3.35 drops a column in place
    op.drop_index("ix_run_groups_created_by", "run_groups")
    op.drop_index("ix_run_groups_created_at", "run_groups")
    op.drop_index("ix_run_groups_experiment_id", "run_groups")
    op.drop_table("run_groups")
