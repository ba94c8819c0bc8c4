"""experiments, runs, attempts, events

Revision ID: 0001
Revises:
Create Date: 2026-11-20
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "experiments",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("experiment_id", sa.String(40), sa.ForeignKey("experiments.id"), nullable=False),
        sa.Column("task_type", sa.String(64), nullable=False),
        sa.Column("template_id", sa.String(128), nullable=False),
        sa.Column("bundle_digest", sa.String(64), nullable=False),
        sa.Column("submission", sa.JSON, nullable=False),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
    )
    op.create_index("ix_runs_experiment_id", "runs", ["experiment_id"])
    op.create_index("ix_runs_bundle_digest", "runs", ["bundle_digest"])
    op.create_index("ix_runs_created_at", "runs", ["created_at"])
    op.create_table(
        "attempts",
        sa.Column("id", sa.String(48), primary_key=True),
        sa.Column("run_id", sa.String(40), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(32)),
        sa.Column("target", sa.String(256)),
        sa.Column("backend_key", sa.String(64), nullable=False),
        sa.Column("trigger", sa.String(16), nullable=False),
        sa.Column("handle", sa.JSON),
        sa.Column("exit_code", sa.Integer),
        sa.Column("message", sa.Text),
        sa.Column("cancel_requested", sa.Boolean, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("started_at", TS),
        sa.Column("finished_at", TS),
    )
    op.create_index("ix_attempts_run_id", "attempts", ["run_id"])
    op.create_index("ix_attempts_state", "attempts", ["state"])
    op.create_index("ix_attempts_run_number", "attempts", ["run_id", "number"], unique=True)
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", TS, nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(40)),
        sa.Column("attempt_id", sa.String(48)),
        sa.Column("data", sa.JSON, nullable=False),
    )
    op.create_index("ix_events_at", "events", ["at"])
    op.create_index("ix_events_run_id", "events", ["run_id"])


def downgrade() -> None:
    op.drop_table("events")
    op.drop_table("attempts")
    op.drop_table("runs")
    op.drop_table("experiments")
