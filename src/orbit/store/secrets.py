"""Secrets in the store: each value sealed under the server's key set (sealed and opened by the
control service, orbit.core.control.secrets: the store never holds a key), listed without it.
Setting, replacing, removing, re-sealing under a new key and each use are audit events that
name the secret, never its value."""

from __future__ import annotations

from datetime import datetime

from orbit.model.errors import NotFound
from orbit.model.secrets import RESOLUTION, Scope, SecretRecord
from orbit.store.audit import append_event
from orbit.store.base import Part, new_id, utcnow
from orbit.store.drivers import Conflict
from orbit.store.sql import Row, read_time, read_time_required

COLUMNS = "id, scope, owner, name, key_id, created_at, created_by, rotated_at, used_at"


def secret_record(row: Row) -> SecretRecord:
    return SecretRecord(
        name=row["name"],
        scope=Scope(row["scope"]),
        owner=row["owner"],
        key_id=row["key_id"],
        created_at=read_time_required(row["created_at"]),
        created_by=row["created_by"],
        rotated_at=read_time(row["rotated_at"]),
        used_at=read_time(row["used_at"]),
    )


class Sealed:
    """A secret's sealed value and where it is (what it is bound to)."""

    def __init__(self, row: Row) -> None:
        self.id: str = row["id"]
        self.scope = Scope(row["scope"])
        self.owner: str = row["owner"]
        self.name: str = row["name"]
        self.key_id: str = row["key_id"]
        self.sealed: str = row["sealed"]


class Secrets(Part):
    def put(
        self, scope: Scope, owner: str, name: str, key_id: str, sealed: str, actor: str
    ) -> SecretRecord:
        """Set the secret's value (sealed); one that replaced a value has its `rotated_at`."""
        place = {"scope": scope.value, "owner": owner, "name": name}
        for _ in range(2):  # a second writer may make it between our look and our insert
            now = utcnow()
            try:
                with self._write() as tx:
                    found = tx.scalar(
                        "SELECT id FROM secrets WHERE scope = :scope AND owner = :owner "
                        "AND name = :name",
                        place,
                    )
                    values = {"key_id": key_id, "sealed": sealed, "now": now}
                    if found is None:
                        tx.execute(
                            "INSERT INTO secrets (id, scope, owner, name, key_id, sealed, "
                            "created_at, created_by) VALUES (:id, :scope, :owner, :name, "
                            ":key_id, :sealed, :now, :actor)",
                            {**place, **values, "id": new_id("sec"), "actor": actor},
                        )
                    else:
                        tx.execute(
                            "UPDATE secrets SET key_id = :key_id, sealed = :sealed, "
                            "rotated_at = :now WHERE id = :id",
                            {**values, "id": found},
                        )
                    action = "secret.set" if found is None else "secret.replaced"
                    append_event(tx, actor, action, **place)
                    row = tx.one(f"SELECT {COLUMNS} FROM secrets WHERE {_PLACE}", place)
                    assert row is not None
                    return secret_record(row)
            except Conflict:
                continue
        raise Conflict(f"secret {name} was written by another process at the same time")

    def list_secrets(
        self, *, scope: Scope | None = None, owner: str | None = None
    ) -> list[SecretRecord]:
        clauses, params = [], {"scope": scope.value if scope else None, "owner": owner}
        if scope is not None:
            clauses.append("scope = :scope")
        if owner is not None:
            clauses.append("owner = :owner")
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._read() as tx:
            rows = tx.all(
                f"SELECT {COLUMNS} FROM secrets{where} ORDER BY scope, owner, name", params
            )
        return [secret_record(row) for row in rows]

    def remove(self, scope: Scope, owner: str, name: str, actor: str) -> SecretRecord:
        place = {"scope": scope.value, "owner": owner, "name": name}
        with self._write() as tx:
            row = tx.one(f"SELECT {COLUMNS} FROM secrets WHERE {_PLACE}", place)
            if row is None:
                raise NotFound(
                    f"no {scope.value} secret '{name}'" + (f" of {owner}" if owner else "")
                )
            tx.execute("DELETE FROM secrets WHERE id = :id", {"id": row["id"]})
            append_event(tx, actor, "secret.removed", **place)
        return secret_record(row)

    def resolve(self, user: str, experiment_id: str, names: set[str]) -> dict[str, Sealed]:
        """Each name's secret for a run `user` submits to the experiment: the user's own, else
        the experiment's, else the global one; a name none has is left out."""
        if not names:
            return {}
        owners = {Scope.USER: user, Scope.EXPERIMENT: experiment_id, Scope.GLOBAL: ""}
        marks = ", ".join(f":n{i}" for i in range(len(names)))
        params: dict[str, object] = {f"n{i}": n for i, n in enumerate(sorted(names))}
        params.update(user=user, experiment=experiment_id)
        with self._read() as tx:
            rows = tx.all(
                "SELECT id, scope, owner, name, key_id, sealed FROM secrets "
                f"WHERE name IN ({marks}) AND ((scope = 'user' AND owner = :user) OR "
                "(scope = 'experiment' AND owner = :experiment) OR scope = 'global')",
                params,
            )
        found: dict[str, Sealed] = {}
        for scope in reversed(RESOLUTION):  # the submitter's own last, so it wins
            for row in rows:
                if row["scope"] == scope.value and row["owner"] == owners[scope]:
                    found[row["name"]] = Sealed(row)
        return found

    def sealed_under_other_keys(self, key_id: str) -> list[Sealed]:
        """Every value not sealed under `key_id` (what a key rotation re-seals)."""
        with self._read() as tx:
            rows = tx.all(
                "SELECT id, scope, owner, name, key_id, sealed FROM secrets "
                "WHERE key_id <> :key_id",
                {"key_id": key_id},
            )
        return [Sealed(row) for row in rows]

    def reseal(self, found: Sealed, key_id: str, sealed: str) -> bool:
        """The same value sealed under another key, unless it changed meanwhile."""
        with self._write() as tx:
            changed = tx.execute(
                "UPDATE secrets SET key_id = :key_id, sealed = :sealed "
                "WHERE id = :id AND key_id = :was AND sealed = :old",
                {"key_id": key_id, "sealed": sealed, "id": found.id, "was": found.key_id,
                 "old": found.sealed},
            )  # fmt: skip
        return changed == 1

    def record_rotation(self, key_id: str, resealed: int, retired: list[str], actor: str) -> None:
        with self._write() as tx:
            append_event(
                tx, actor, "secret.key_rotated", key_id=key_id, resealed=resealed,
                retired=retired,
            )  # fmt: skip

    def key_ids(self) -> set[str]:
        """The keys the store's values are sealed under."""
        with self._read() as tx:
            return {row["key_id"] for row in tx.all("SELECT DISTINCT key_id FROM secrets")}

    def mark_used(
        self, used: list[Sealed], *, run_id: str, attempt_id: str, actor: str, at: datetime
    ) -> None:
        """The secrets delivered to an attempt: when, and an audit event naming them."""
        if not used:
            return
        with self._write() as tx:
            for found in used:
                tx.execute(
                    "UPDATE secrets SET used_at = :at WHERE id = :id", {"at": at, "id": found.id}
                )
            append_event(
                tx, actor, "secret.used", run_id=run_id, attempt_id=attempt_id,
                secrets=[f"{s.scope.value}:{s.name}" for s in used],
            )  # fmt: skip


_PLACE = "scope = :scope AND owner = :owner AND name = :name"
