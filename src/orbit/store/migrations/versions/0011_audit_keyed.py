"""the keyed audit chain: events.mac (an HMAC of the event's hash under the audit key, none for
the events written before keying began) and audit_seal, the one row naming the first keyed
event, the key's id and the chain's head under a MAC (see orbit.model.audit_chain). Nothing is
re-hashed: the existing events keep verifying by the plain rule

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("mac", sa.String(64), nullable=True))
    op.create_table(
        "audit_seal",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("keyed_from", sa.Integer, nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("head_id", sa.Integer, nullable=False),
        sa.Column("head_hash", sa.String(64), nullable=False),
        sa.Column("mac", sa.String(64), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("audit_seal")
    with op.batch_alter_table("events") as batch:
        batch.drop_column("mac")
