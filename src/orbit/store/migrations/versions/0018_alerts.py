"""alerts: conditions that need a person, one open per key (a partial unique index), with what
they concern, a remedy, when raised and resolved, who acknowledged and until when silenced

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("alert_key", sa.String(256), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("objects", sa.JSON, nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("remedy", sa.Text, nullable=False),
        sa.Column("raised_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("acked_by", sa.String(128), nullable=True),
        sa.Column("acked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("silenced_until", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_alerts_raised_at", "alerts", ["raised_at"])
    op.create_index(
        "ix_alerts_open_key", "alerts", ["alert_key"], unique=True,
        sqlite_where=sa.text("resolved_at IS NULL"),
        postgresql_where=sa.text("resolved_at IS NULL"),
    )  # fmt: skip


def downgrade() -> None:
    op.drop_index("ix_alerts_open_key", "alerts")
    op.drop_index("ix_alerts_raised_at", "alerts")
    op.drop_table("alerts")
