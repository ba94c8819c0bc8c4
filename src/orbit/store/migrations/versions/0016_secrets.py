"""secrets: a secret's value sealed under the server's key set (orbit.model.secret_keys) with
the id of the key, one per scope, owner and name, and when it was made, rotated and used

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "secrets",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("sealed", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("rotated_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index(
        "ix_secrets_scope_owner_name", "secrets", ["scope", "owner", "name"], unique=True
    )
    op.create_index("ix_secrets_key_id", "secrets", ["key_id"])


def downgrade() -> None:
    op.drop_index("ix_secrets_key_id", "secrets")
    op.drop_index("ix_secrets_scope_owner_name", "secrets")
    op.drop_table("secrets")
