"""The audit chain's seal in the store (orbit.model.audit_chain.Seal): read it, rewrite it with
each keyed append, and refuse a key that is not the one the chain is keyed under."""

from __future__ import annotations

from orbit.model.audit_chain import Seal, key_id, other_key
from orbit.model.errors import InvalidInput
from orbit.store.sql import Database, Tx

SEAL_COLUMNS = "keyed_from, key_id, head_id, head_hash, mac"


def read_seal(tx: Tx) -> Seal | None:
    row = tx.one(f"SELECT {SEAL_COLUMNS} FROM audit_seal WHERE id = 1")
    return None if row is None else Seal(**row)


def write_seal(tx: Tx, seal: Seal) -> None:
    """Insert or replace the one seal row, in the caller's (appending) transaction."""
    values = {
        "keyed_from": seal.keyed_from,
        "key_id": seal.key_id,
        "head_id": seal.head_id,
        "head_hash": seal.head_hash,
        "mac": seal.mac,
    }
    changed = tx.execute(
        "UPDATE audit_seal SET keyed_from = :keyed_from, key_id = :key_id, head_id = :head_id, "
        "head_hash = :head_hash, mac = :mac WHERE id = 1",
        values,
    )
    if not changed:
        tx.execute(
            f"INSERT INTO audit_seal (id, {SEAL_COLUMNS}) "
            "VALUES (1, :keyed_from, :key_id, :head_id, :head_hash, :mac)",
            values,
        )


def check_audit_key(db: Database, key: bytes) -> None:
    """Refuse, in one line, a key other than the one the store's chain is keyed under: its
    events would not verify, and every later append would break the chain for the others."""
    with db.transaction(write=False) as tx:
        seal = read_seal(tx)
    if seal is not None and seal.key_id != key_id(key):
        raise InvalidInput(other_key(seal.key_id, key))
