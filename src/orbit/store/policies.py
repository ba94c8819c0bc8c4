"""Policy versions in the store: each applied file kept whole with its sha256, numbered from 1,
the newest in force; applying one is an audit event. And the submissions a candidate policy is
replayed against (`policy diff`): the runs made since a time, with what each recorded of its
admission, read a page at a time."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from orbit.model.errors import NotFound
from orbit.model.policies import PolicyVersion
from orbit.store.audit import append_event
from orbit.store.base import Part, utcnow
from orbit.store.drivers import Conflict
from orbit.store.sql import Row, read_json, read_time_required

COLUMNS = "version, sha256, rules, applied_at, applied_by"
PAGE = 2000


def _version(row: Row, body: bool = False) -> PolicyVersion:
    return PolicyVersion(
        version=row["version"],
        sha256=row["sha256"],
        rules=row["rules"],
        applied_at=read_time_required(row["applied_at"]),
        applied_by=row["applied_by"],
        body=row["body"] if body else None,
    )


class Policies(Part):
    def apply(self, body: str, sha256: str, rules: int, actor: str) -> PolicyVersion:
        """The file as the next version, in force from now on."""
        for attempt in range(3):  # another apply may take the same number first
            try:
                with self._write() as tx:
                    newest = tx.scalar("SELECT MAX(version) FROM policies")
                    version = int(newest or 0) + 1
                    values = {
                        "version": version, "body": body, "sha256": sha256, "rules": rules,
                        "at": utcnow(), "by": actor,
                    }  # fmt: skip
                    tx.execute(
                        "INSERT INTO policies (version, body, sha256, rules, applied_at, "
                        "applied_by) VALUES (:version, :body, :sha256, :rules, :at, :by)",
                        values,
                    )
                    append_event(
                        tx, actor, "policy.applied", version=version, sha256=sha256, rules=rules
                    )
                return self.get(version)
            except Conflict:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def newest(self) -> int | None:
        """The version in force (one index read: what a submit asks before it needs the file)."""
        with self._read() as tx:
            found = tx.scalar("SELECT MAX(version) FROM policies")
        return int(found) if found is not None else None

    def current(self) -> PolicyVersion | None:
        """The policy in force, with its file; None before any was applied."""
        with self._read() as tx:
            row = tx.one(f"SELECT {COLUMNS}, body FROM policies ORDER BY version DESC LIMIT 1", {})
        return _version(row, body=True) if row is not None else None

    def get(self, version: int) -> PolicyVersion:
        with self._read() as tx:
            row = tx.one(f"SELECT {COLUMNS}, body FROM policies WHERE version = :v", {"v": version})
        if row is None:
            raise NotFound(f"unknown policy version {version} (see 'orbit policy history')")
        return _version(row, body=True)

    def history(self) -> list[PolicyVersion]:
        """Every version, newest first, without its file."""
        with self._read() as tx:
            rows = tx.all(f"SELECT {COLUMNS} FROM policies ORDER BY version DESC", {})
        return [_version(r) for r in rows]

    def recorded_since(
        self, since: datetime, until: datetime | None = None
    ) -> Iterator[dict[str, Any]]:
        """The runs made since `since` (and before `until`), oldest first: id, when, by whom,
        the experiment's name, the task type, the request and submission, and what it recorded
        of its admission."""
        after: tuple[Any, str] = (since, "")
        while True:
            with self._read() as tx:
                rows = tx.all(
                    "SELECT r.id, r.created_at, r.created_by, e.name AS experiment, r.task_type, "
                    "r.request, r.submission, r.policy FROM runs r JOIN experiments e ON "
                    "e.id = r.experiment_id WHERE r.created_at > :at OR (r.created_at = :at "
                    "AND r.id > :id) ORDER BY r.created_at, r.id LIMIT :n",
                    {"at": after[0], "id": after[1], "n": PAGE},
                )
            for row in rows:
                if until is not None and read_time_required(row["created_at"]) >= until:
                    return
                yield {
                    "id": row["id"],
                    "created_at": read_time_required(row["created_at"]),
                    "created_by": row["created_by"],
                    "experiment": row["experiment"],
                    "task_type": row["task_type"],
                    "request": read_json(row["request"]),
                    "submission": read_json(row["submission"]),
                    "policy": read_json(row["policy"]),
                }
            if len(rows) < PAGE:
                return
            after = (rows[-1]["created_at"], rows[-1]["id"])
