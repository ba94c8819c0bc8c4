"""storage with a lifecycle: run_storage (a run pinned, deleted or its artifacts expired, by whom
and when: the run's own row and its audit trail stay), artifact_removals (what retention, gc
and deletion removed of an attempt's files, so that collect can say so rather than call them
missing), storage_sizes (the bytes of an attempt's or a bundle's copy, measured once it can no
longer change) and storage_gc (one row: when the next gc pass is due, and which server
replica holds it)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_storage",
        sa.Column("run_id", sa.String(40), sa.ForeignKey("runs.id"), primary_key=True),
        sa.Column("pinned", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("pinned_by", sa.String(128), nullable=True),
        sa.Column("pinned_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deleted_by", sa.String(128), nullable=True),
        sa.Column("expired_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "artifact_removals",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(40), nullable=False),
        sa.Column("attempt_id", sa.String(48), nullable=False),
        sa.Column("path", sa.String(1024), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("files", sa.Integer, nullable=False),
        sa.Column("why", sa.String(32), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_artifact_removals_attempt_id", "artifact_removals", ["attempt_id"])
    op.create_table(
        "storage_sizes",
        sa.Column("key", sa.String(128), primary_key=True),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("files", sa.Integer, nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "storage_gc",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ran_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("holder", sa.String(128), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("storage_gc")
    op.drop_table("storage_sizes")
    op.drop_index("ix_artifact_removals_attempt_id", "artifact_removals")
    op.drop_table("artifact_removals")
    op.drop_table("run_storage")
