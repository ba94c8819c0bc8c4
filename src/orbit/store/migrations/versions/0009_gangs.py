"""gangs on agent pools: a run across several nodes is one attempt (rank 0, its leader) and a
member attempt per other node (attempts.gang_of names the leader, attempts.rank the node's
rank). A member shares its leader's run and number, so the unique index takes the rank too

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("gang_of", sa.String(48), nullable=True))
        batch.add_column(sa.Column("rank", sa.Integer, nullable=False, server_default="0"))
        batch.drop_index("ix_attempts_run_number")
        batch.create_index("ix_attempts_run_number", ["run_id", "number", "rank"], unique=True)
        batch.create_index("ix_attempts_gang_of", ["gang_of"])


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_index("ix_attempts_gang_of")
        batch.drop_index("ix_attempts_run_number")
        batch.create_index("ix_attempts_run_number", ["run_id", "number"], unique=True)
        batch.drop_column("rank")
        batch.drop_column("gang_of")
