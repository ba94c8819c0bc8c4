"""runs.state: a copy of each run's current attempt's state (its highest number, rank 0), kept
in the transaction that moves or opens an attempt (orbit.store.attempt_states), so that a
listing by state is one index range, newest first (ix_runs_state_created_at), not a join to
every run's attempts; and ix_attempts_updated_at, so that the newest change (the console's
live parts ask once a second) is one index lookup

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a plain ADD COLUMN (its default fills the rows) on SQLite too: a batch copy would drop
    # the runs table that attempts refer to
    op.add_column(
        "runs", sa.Column("state", sa.String(16), nullable=False, server_default="prepared")
    )
    op.execute(
        "UPDATE runs SET state = (SELECT a.state FROM attempts a WHERE a.run_id = runs.id "
        "AND a.rank = 0 ORDER BY a.number DESC LIMIT 1) "
        "WHERE EXISTS (SELECT 1 FROM attempts a WHERE a.run_id = runs.id)"
    )
    op.create_index("ix_runs_state_created_at", "runs", ["state", "created_at"])
    op.create_index("ix_attempts_updated_at", "attempts", ["updated_at"])


def downgrade() -> None:
    op.drop_index("ix_attempts_updated_at", "attempts")
    op.drop_index("ix_runs_state_created_at", "runs")
    op.drop_column("runs", "state")  # SQLite >= 3.35 drops a column in place
