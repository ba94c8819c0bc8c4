"""the scheduler's records: each pass's inputs (the node snapshot and the queue, for replay
and simulation), each run's latest decision, the quotas admins set; attempts.preempted_by
(the run an attempt is being stopped for) and nodes.preempted_at (the preemption rate limit)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "sched_passes",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("at", TS, nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("inputs", sa.Text, nullable=False),  # zlib + base64 of the canonical JSON
        sa.Column("placed", sa.Integer, nullable=False),
        sa.Column("waiting", sa.Integer, nullable=False),
        sa.Column("preempted", sa.Integer, nullable=False),
    )
    op.create_index("ix_sched_passes_at", "sched_passes", ["at"])
    op.create_table(
        "sched_decisions",
        sa.Column("run_id", sa.String(48), primary_key=True),
        sa.Column("attempt_id", sa.String(48), nullable=False),
        sa.Column("pass_id", sa.String(40), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("tier", sa.String(32), nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("body", sa.Text, nullable=False),  # the canonical JSON, byte for byte
        sa.Column(
            "gist", sa.String(64), nullable=False
        ),  # the body but for what every pass changes
        sa.Column("at", TS, nullable=False),
    )
    op.create_index("ix_sched_decisions_pass_id", "sched_decisions", ["pass_id"])
    op.create_table(
        "quotas",
        sa.Column("scope", sa.String(16), primary_key=True),
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("weight", sa.Float, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("updated_by", sa.String(128), nullable=False),
    )
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("preempted_by", sa.String(48), nullable=True))
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("preempted_at", TS, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("preempted_at")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("preempted_by")
    op.drop_table("quotas")
    op.drop_index("ix_sched_decisions_pass_id", "sched_decisions")
    op.drop_table("sched_decisions")
    op.drop_index("ix_sched_passes_at", "sched_passes")
    op.drop_table("sched_passes")
