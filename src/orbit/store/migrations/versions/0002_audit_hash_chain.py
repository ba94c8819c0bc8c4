"""events: the audit hash chain (prev_hash, hash), backfilled over the existing events

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

from orbit.model.audit_chain import event_hash

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

EVENTS = sa.table(
    "events",
    sa.column("id", sa.Integer),
    sa.column("at", sa.DateTime(timezone=True)),
    sa.column("actor", sa.String),
    sa.column("action", sa.String),
    sa.column("run_id", sa.String),
    sa.column("attempt_id", sa.String),
    sa.column("data", sa.JSON),
    sa.column("prev_hash", sa.String),
    sa.column("hash", sa.String),
)


def upgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("prev_hash", sa.String(64), nullable=True))
        batch.add_column(sa.Column("hash", sa.String(64), nullable=True))

    # chain what is there, oldest first; nothing else writes while the migration holds the store
    connection = op.get_bind()
    rows = connection.execute(
        sa.select(
            EVENTS.c.id,
            EVENTS.c.at,
            EVENTS.c.actor,
            EVENTS.c.action,
            EVENTS.c.run_id,
            EVENTS.c.attempt_id,
            EVENTS.c.data,
        ).order_by(EVENTS.c.id)
    ).all()
    prev: str | None = None
    links: list[dict[str, object]] = []
    for row in rows:
        digest = event_hash(
            prev_hash=prev,
            at=row.at,
            actor=row.actor,
            action=row.action,
            run_id=row.run_id,
            attempt_id=row.attempt_id,
            data=row.data,
        )
        links.append({"row_id": row.id, "prev": prev, "digest": digest})
        prev = digest
    if links:
        connection.execute(
            EVENTS.update()
            .where(EVENTS.c.id == sa.bindparam("row_id"))
            .values(prev_hash=sa.bindparam("prev"), hash=sa.bindparam("digest")),
            links,
        )

    with op.batch_alter_table("events") as batch:
        batch.alter_column("hash", existing_type=sa.String(64), nullable=False)
        batch.create_index("ix_events_hash", ["hash"], unique=True)
        batch.create_index("ix_events_prev_hash", ["prev_hash"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.drop_index("ix_events_prev_hash")
        batch.drop_index("ix_events_hash")
        batch.drop_column("hash")
        batch.drop_column("prev_hash")
