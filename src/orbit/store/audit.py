"""The audit trail in the store: appending to the hash chain (keyed where the store holds the
audit key), listing it, checking it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from orbit.model.audit_chain import (
    SEAL_BROKEN,
    Anchor,
    ChainCheck,
    Seal,
    canonical_data,
    check_chain,
    event_hash,
    event_mac,
    key_id,
    other_key,
)
from orbit.model.errors import InvalidInput
from orbit.model.records import AuditEvent
from orbit.store.audit_seal import read_seal, write_seal
from orbit.store.base import Part, utcnow
from orbit.store.sql import Row, Tx, read_json, read_time_required

# pg_advisory_xact_lock key ("ORBITAUD") serialising appends to the audit chain on PostgreSQL
AUDIT_LOCK_KEY = 0x4F52424954415544

EVENT_COLUMNS = "id, at, actor, action, run_id, attempt_id, data, prev_hash, hash, mac"


def append_event(
    tx: Tx,
    actor: str,
    action: str,
    *,
    run_id: str | None = None,
    attempt_id: str | None = None,
    **data: Any,
) -> None:
    """Append one event to the audit chain, in the caller's write transaction; keyed, and the
    seal moved onto it, where the store holds the audit key (orbit.model.audit_chain).

    Appends are serialised, so no two events ever chain onto the same one: on PostgreSQL by a
    transaction-scoped advisory lock taken before the last hash is read (held to commit; taking
    it again in the same transaction is free); on SQLite by the write transaction's BEGIN
    IMMEDIATE. The id is assigned under the same lock, so id order is chain order."""
    if not tx.write:
        raise RuntimeError("audit events are written only inside a write transaction")
    if tx.dialect == "postgresql":
        tx.execute("SELECT pg_advisory_xact_lock(:key)", {"key": AUDIT_LOCK_KEY})
    last = tx.one("SELECT id, hash FROM events ORDER BY id DESC LIMIT 1")
    prev = last["hash"] if last else None
    key = tx.audit_key
    if key is None:
        _insert(tx, prev, actor, action, run_id, attempt_id, data)
        return
    seal = read_seal(tx)
    if seal is not None and seal.key_id != key_id(key):
        raise InvalidInput(other_key(seal.key_id, key))  # another writer keyed it meanwhile
    keyed_from, broken = _seal_found(tx, key, seal, last)
    if broken is not None:
        _, prev = _insert(tx, prev, "orbit", SEAL_BROKEN, None, None, broken)
    event_id, digest = _insert(tx, prev, actor, action, run_id, attempt_id, data)
    write_seal(tx, Seal.made(key, keyed_from or event_id, event_id, digest))


def _seal_found(
    tx: Tx, key: bytes, seal: Seal | None, last: Row | None
) -> tuple[int | None, dict[str, Any] | None]:
    """From which event the chain is keyed (none: from the next), and what is wrong with the
    seal as this append finds it, if anything: it must be valid and on the `last` event."""
    if seal is None:
        keyed_from = tx.scalar("SELECT min(id) FROM events WHERE mac IS NOT NULL")
        return keyed_from, (None if keyed_from is None else {"seal": "missing"})
    if not seal.valid(key):
        return seal.keyed_from, {"seal": "altered"}
    if last is None or (last["id"], last["hash"]) != (seal.head_id, seal.head_hash):
        found = last["id"] if last else None
        return seal.keyed_from, {"seal": "behind", "sealed_head": seal.head_id, "last": found}
    return seal.keyed_from, None


def _insert(
    tx: Tx,
    prev: str | None,
    actor: str,
    action: str,
    run_id: str | None,
    attempt_id: str | None,
    data: dict[str, Any],
) -> tuple[int, str]:
    """Chain one event onto `prev`, the last hash, under the caller's lock: its id and hash."""
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
    event_id = tx.scalar(
        "INSERT INTO events (at, actor, action, run_id, attempt_id, data, prev_hash, hash, mac) "
        "VALUES (:at, :actor, :action, :run_id, :attempt_id, :data, :prev_hash, :hash, :mac) "
        "RETURNING id",
        {
            "at": at,
            "actor": actor,
            "action": action,
            "run_id": run_id,
            "attempt_id": attempt_id,
            "data": content,
            "prev_hash": prev,
            "hash": digest,
            "mac": event_mac(tx.audit_key, digest) if tx.audit_key is not None else None,
        },
    )
    return int(event_id), digest


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
        mac=row["mac"],
    )


class AuditTrail(Part):
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

    def check_audit(self, anchors: Iterable[Anchor] = ()) -> ChainCheck:
        """Walk the whole audit chain, oldest first, in one read transaction: with the store's
        audit key, its MACs and seal too; and each anchor (an event an admin wrote down)."""
        with self._read() as tx:
            seal = read_seal(tx)
            rows = tx.stream(f"SELECT {EVENT_COLUMNS} FROM events ORDER BY id")
            events = (event_record(r) for r in rows)
            return check_chain(events, key=tx.audit_key, seal=seal, anchors=anchors)

    def verify_audit(self) -> list[str]:
        """Every problem with the audit chain, one line each naming the event; empty when the
        chain is intact."""
        return list(self.check_audit().problems)
