"""nodes (in-house servers whose agents connect out), their join tokens and command queue;
attempts.node_id, fence and node_claimed_at: where an agent_pool attempt was placed, under
which fence, and when its node was granted the one start it gets

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "join_tokens",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("hash", sa.String(64), nullable=False, unique=True),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("expires_at", TS, nullable=True),
        sa.Column("revoked_at", TS, nullable=True),
        sa.Column("uses", sa.Integer, nullable=False, server_default="0"),
    )
    op.create_table(
        "nodes",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("credential_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("info", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("max_tasks", sa.Integer, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("last_seen_at", TS, nullable=True),
        sa.Column("session", sa.String(64), nullable=True),
        sa.Column("report_seq", sa.Integer, nullable=False, server_default="0"),
    )
    op.create_table(
        "node_commands",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(48), nullable=False, unique=True),
        sa.Column("node_id", sa.String(40), sa.ForeignKey("nodes.id"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("attempt_id", sa.String(48), nullable=True),
        sa.Column("body", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("acked_at", TS, nullable=True),
        sa.Column("done_at", TS, nullable=True),
        sa.Column("result", sa.JSON, nullable=True),
    )
    op.create_index("ix_node_commands_node_acked", "node_commands", ["node_id", "acked_at"])
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("node_id", sa.String(40), nullable=True))
        batch.add_column(sa.Column("fence", sa.Integer, nullable=True))
        batch.add_column(sa.Column("node_claimed_at", TS, nullable=True))
        batch.add_column(sa.Column("node_gpus", sa.JSON, nullable=True))
    op.create_index("ix_attempts_node_id", "attempts", ["node_id"])


def downgrade() -> None:
    op.drop_index("ix_attempts_node_id", "attempts")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("node_gpus")
        batch.drop_column("node_claimed_at")
        batch.drop_column("fence")
        batch.drop_column("node_id")
    op.drop_index("ix_node_commands_node_acked", "node_commands")
    op.drop_table("node_commands")
    op.drop_table("nodes")
    op.drop_table("join_tokens")
