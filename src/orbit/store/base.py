"""What every part of the Store shares: its database, migrated on open, and its transactions."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from orbit.store.audit_seal import check_audit_key
from orbit.store.schema import migrate
from orbit.store.sql import Database, Tx


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def open_database(
    url: str, audit_key: bytes | None = None, pool_size: int | None = None
) -> Database:
    """The database at `url`, migrated to the newest schema. `audit_key`: key the audit chain
    with it (orbit.model.audit_chain); a store whose chain is keyed under another key is
    refused here, before anything is written. `pool_size`: see Database."""
    db = Database(url, pool_size)
    db.audit_key = audit_key
    try:
        migrate(db)
        if audit_key is not None:
            check_audit_key(db, audit_key)
    except BaseException:
        db.close()
        raise
    return db


class Part:
    """One part of the Store (orbit.store.repository): the rows of one concern, read and
    written in transactions of the database it is given."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @property
    def dialect(self) -> str:
        """`sqlite` or `postgresql`."""
        return self.db.dialect

    @contextmanager
    def _read(self) -> Iterator[Tx]:
        """A read transaction: one consistent view, never waiting for a writer on SQLite."""
        with self.db.transaction(write=False) as tx:
            yield tx

    @contextmanager
    def _write(self) -> Iterator[Tx]:
        """A write transaction: BEGIN IMMEDIATE on SQLite (see drivers.SqliteDriver.begin)."""
        with self.db.transaction(write=True) as tx:
            yield tx
