"""hosts: the registry of SSH hosts; attempts.last_contact_at and unreachable_since

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hosts",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("facts", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
    )
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("last_contact_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("unreachable_since", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("unreachable_since")
        batch.drop_column("last_contact_at")
    op.drop_table("hosts")
