"""Idempotency keys of submissions: which run a user's key made. A client that lost the answer
to a submit (its connection broke, the server crashed) sends it again with the same key and is
answered with that run instead of getting a second one.

A key is written in the transaction that creates its run (Runs.create_run), so the two
exist together or not at all: after a crash a retry finds both or neither. Keys are kept for
KEEP (a day); each new one clears those older than that, so the table holds about a day of
submits. A retry later than that makes a new run."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from orbit.store.base import Part, utcnow
from orbit.store.sql import Tx

KEEP = timedelta(hours=24)


@dataclass(frozen=True)
class SubmitKey:
    """A key as its user sent it, and the fingerprint (sha256) of what it was sent with: the
    same key with something else is another submission, refused rather than answered."""

    user: str
    value: str
    fingerprint: str


@dataclass(frozen=True)
class KeyedRun:
    """What a key made: its run, and the fingerprint of the submission that made it."""

    run_id: str
    fingerprint: str


class KeyTaken(Exception):
    """Another submission wrote the key first (a retry that raced its original, still at
    work when the client gave up on it): the transaction that met it is rolled back."""


def remember(tx: Tx, key: SubmitKey, run_id: str) -> None:
    """Write `key` for `run_id` in the caller's transaction, or raise KeyTaken. On PostgreSQL
    a second writer of the same key waits for the first one's transaction to end."""
    now = utcnow()
    tx.execute("DELETE FROM submit_keys WHERE created_at < :cutoff", {"cutoff": now - KEEP})
    written = tx.execute(
        "INSERT INTO submit_keys (user_name, key, fingerprint, run_id, created_at) "
        "VALUES (:user, :key, :fingerprint, :run_id, :now) "
        "ON CONFLICT (user_name, key) DO NOTHING",
        {
            "user": key.user,
            "key": key.value,
            "fingerprint": key.fingerprint,
            "run_id": run_id,
            "now": now,
        },
    )
    if written != 1:
        raise KeyTaken(key.value)


class SubmitKeys(Part):
    def find_submit_key(self, user: str, value: str, at: datetime | None = None) -> KeyedRun | None:
        """The run `user`'s key `value` made within KEEP of `at` (now), if any."""
        cutoff = (at or utcnow()) - KEEP
        with self._read() as tx:
            row = tx.one(
                "SELECT run_id, fingerprint FROM submit_keys "
                "WHERE user_name = :user AND key = :key AND created_at >= :cutoff",
                {"user": user, "key": value, "cutoff": cutoff},
            )
        return None if row is None else KeyedRun(str(row["run_id"]), str(row["fingerprint"]))
