"""users and their API tokens (hashes only); attempts.reconcile_owner and reconcile_due_at:
which server replica's reconcile loop looks at an attempt, and when it is next due a look

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("user_id", sa.String(40), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("name", sa.String(128), nullable=True),
        sa.Column("hash", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=True),
        sa.Column("revoked_at", TS, nullable=True),
        sa.Column("last_used_at", TS, nullable=True),
    )
    op.create_index("ix_tokens_user_id", "tokens", ["user_id"])
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("reconcile_owner", sa.String(128), nullable=True))
        batch.add_column(sa.Column("reconcile_due_at", TS, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("reconcile_due_at")
        batch.drop_column("reconcile_owner")
    op.drop_table("tokens")
    op.drop_table("users")
