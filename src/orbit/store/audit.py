"""The audit trail in the store: appending to the hash chain, listing it, checking it."""

from __future__ import annotations

from typing import Any

from orbit.core.audit_chain import ChainCheck, canonical_data, check_chain, event_hash
from orbit.core.records import AuditEvent
from orbit.store.base import StoreBase, utcnow
from orbit.store.sql import Row, Tx, read_json, read_time_required

# pg_advisory_xact_lock key ("ORBITAUD") serialising appends to the audit chain on PostgreSQL
AUDIT_LOCK_KEY = 0x4F52424954415544

EVENT_COLUMNS = "id, at, actor, action, run_id, attempt_id, data, prev_hash, hash"


def append_event(
    tx: Tx,
    actor: str,
    action: str,
    *,
    run_id: str | None = None,
    attempt_id: str | None = None,
    **data: Any,
) -> None:
    """Append one event to the audit chain, in the caller's write transaction.

    Appends are serialised, so no two events ever chain onto the same one: on PostgreSQL by a
    transaction-scoped advisory lock taken before the last hash is read (held to commit; taking
    it again in the same transaction is free); on SQLite by the write transaction's BEGIN
    IMMEDIATE. The id is assigned under the same lock, so id order is chain order."""
    if not tx.write:
        raise RuntimeError("audit events are written only inside a write transaction")
    if tx.dialect == "postgresql":
        tx.execute("SELECT pg_advisory_xact_lock(:key)", {"key": AUDIT_LOCK_KEY})
    prev = tx.scalar("SELECT hash FROM events ORDER BY id DESC LIMIT 1")
    at = utcnow()
    content = canonical_data(data)
    digest = event_hash(
        prev_hash=prev,
        at=at,
        actor=actor,
        action=action,
        run_id=run_id,
        attempt_id=attempt_id,
        data=content,
    )
    tx.execute(
        "INSERT INTO events (at, actor, action, run_id, attempt_id, data, prev_hash, hash) "
        "VALUES (:at, :actor, :action, :run_id, :attempt_id, :data, :prev_hash, :hash)",
        {
            "at": at,
            "actor": actor,
            "action": action,
            "run_id": run_id,
            "attempt_id": attempt_id,
            "data": content,
            "prev_hash": prev,
            "hash": digest,
        },
    )


def event_record(row: Row) -> AuditEvent:
    return AuditEvent(
        id=row["id"],
        at=read_time_required(row["at"]),
        actor=row["actor"],
        action=row["action"],
        run_id=row["run_id"],
        attempt_id=row["attempt_id"],
        data=read_json(row["data"]),
        prev_hash=row["prev_hash"],
        hash=row["hash"],
    )


class AuditMixin(StoreBase):
    def record_event(
        self,
        actor: str,
        action: str,
        *,
        run_id: str | None = None,
        attempt_id: str | None = None,
        **data: Any,
    ) -> None:
        with self._write() as tx:
            append_event(tx, actor, action, run_id=run_id, attempt_id=attempt_id, **data)

    def list_events(
        self, *, run_id: str | None = None, limit: int | None = None
    ) -> list[AuditEvent]:
        """Oldest first; with `limit`, the newest `limit` events (still oldest first)."""
        where = "WHERE run_id = :run_id" if run_id is not None else ""
        order = "ORDER BY id DESC LIMIT :limit" if limit is not None else "ORDER BY id"
        with self._read() as tx:
            rows = tx.all(
                f"SELECT {EVENT_COLUMNS} FROM events {where} {order}",
                {"run_id": run_id, "limit": limit},
            )
        if limit is not None:
            rows.reverse()
        return [event_record(r) for r in rows]

    def check_audit(self) -> ChainCheck:
        """Walk the whole audit chain, oldest first, in one read transaction."""
        with self._read() as tx:
            rows = tx.stream(f"SELECT {EVENT_COLUMNS} FROM events ORDER BY id")
            return check_chain(event_record(r) for r in rows)

    def verify_audit(self) -> list[str]:
        """Every problem with the audit chain, one line each naming the event; empty when the
        chain is intact."""
        return list(self.check_audit().problems)
