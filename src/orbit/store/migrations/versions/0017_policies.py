"""policies: each applied policy file, whole, with its sha256 (the newest in force); runs.policy:
what a run recorded of its admission (the version, its warnings and defaults, the submitter's
role and usage then)

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "policies",
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("rules", sa.Integer, nullable=False),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("applied_by", sa.String(128), nullable=False),
    )
    # a plain ADD COLUMN on SQLite too: a batch copy would drop the runs table attempts refer to
    op.add_column("runs", sa.Column("policy", sa.JSON, nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "policy")  # SQLite >= 3.35 drops a column in place
    op.drop_table("policies")
