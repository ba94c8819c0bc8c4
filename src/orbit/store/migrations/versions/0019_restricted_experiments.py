"""restricted experiments: an experiment may be marked restricted, and then only its members (and
those who manage experiments) see its runs, logs and artifacts

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a plain ADD COLUMN on SQLite too: a batch copy would drop the table runs refer to
    op.add_column(
        "experiments",
        sa.Column("restricted", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.create_table(
        "experiment_members",
        sa.Column(
            "experiment_id", sa.String(40), sa.ForeignKey("experiments.id"), primary_key=True
        ),
        sa.Column("user_name", sa.String(64), primary_key=True),
        sa.Column("added_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("added_by", sa.String(128), nullable=False),
    )
    op.create_index("ix_experiment_members_user_name", "experiment_members", ["user_name"])


def downgrade() -> None:
    op.drop_index("ix_experiment_members_user_name", "experiment_members")
    op.drop_table("experiment_members")
    op.drop_column("experiments", "restricted")  # SQLite >= 3.35 drops a column in place
