"""submit_keys: a submission's idempotency key (per user) and the run it made, so that a client
that lost the answer and sends the same submission again gets that run rather than a second one

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "submit_keys",
        sa.Column("user_name", sa.String(128), primary_key=True),
        sa.Column("key", sa.String(128), primary_key=True),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(40), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_submit_keys_created_at", "submit_keys", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_submit_keys_created_at", "submit_keys")
    op.drop_table("submit_keys")
