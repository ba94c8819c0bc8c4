"""The hosts registry in the store: add, read, record a check's facts, remove; each audited."""

from __future__ import annotations

from orbit.model.errors import InvalidInput, NotFound
from orbit.model.hosts import HostFacts, HostRecord, HostSpec
from orbit.model.models import RunState
from orbit.store.audit import append_event
from orbit.store.base import Part, utcnow
from orbit.store.drivers import Conflict
from orbit.store.sql import Row, expand, read_json, read_time_required

HOST_COLUMNS = "name, spec, facts, created_at, created_by"


def already_exists(name: str) -> InvalidInput:
    return InvalidInput(f"host '{name}' already exists (orbit hosts remove {name} first)")


def unknown(name: str) -> NotFound:
    return NotFound(f"unknown host '{name}' (see 'orbit hosts list')")


def is_cluster(row: Row) -> bool:
    """A Slurm cluster shares the table (orbit.store.cluster_table): its spec says so."""
    spec = read_json(row["spec"])
    return isinstance(spec, dict) and spec.get("kind") == "slurm"


def host_record(row: Row) -> HostRecord:
    facts = read_json(row["facts"])
    return HostRecord(
        spec=HostSpec.model_validate(read_json(row["spec"])),
        facts=HostFacts.model_validate(facts) if facts else None,
        created_at=read_time_required(row["created_at"]),
        created_by=row["created_by"],
    )


class HostTable(Part):
    def add(self, spec: HostSpec, facts: HostFacts | None, actor: str) -> HostRecord:
        try:
            with self._write() as tx:
                tx.execute(
                    f"INSERT INTO hosts ({HOST_COLUMNS}) "
                    "VALUES (:name, :spec, :facts, :created_at, :created_by)",
                    {
                        "name": spec.name,
                        "spec": spec.model_dump(mode="json"),
                        "facts": facts.model_dump(mode="json") if facts else None,
                        "created_at": utcnow(),
                        "created_by": actor,
                    },
                )
                append_event(tx, actor, "host.added", host=spec.name, ssh=spec.ssh)
        except Conflict:  # another add won the race
            raise already_exists(spec.name) from None
        return self.get(spec.name)

    def find(self, name: str) -> HostRecord | None:
        with self._read() as tx:
            row = tx.one(f"SELECT {HOST_COLUMNS} FROM hosts WHERE name = :name", {"name": name})
        return None if row is None or is_cluster(row) else host_record(row)

    def get(self, name: str) -> HostRecord:
        found = self.find(name)
        if found is None:
            raise unknown(name)
        return found

    def all(self) -> list[HostRecord]:
        with self._read() as tx:
            rows = tx.all(f"SELECT {HOST_COLUMNS} FROM hosts ORDER BY name")
        return [host_record(r) for r in rows if not is_cluster(r)]

    def set_facts(self, name: str, facts: HostFacts, actor: str) -> HostRecord:
        with self._write() as tx:
            changed = tx.execute(
                "UPDATE hosts SET facts = :facts WHERE name = :name",
                {"facts": facts.model_dump(mode="json"), "name": name},
            )
            if changed != 1:
                raise unknown(name)
            append_event(
                tx,
                actor,
                "host.checked",
                host=name,
                gpus=len(facts.gpus),
                python=facts.python_version,
                disk_free_bytes=facts.disk_free_bytes,
            )
        return self.get(name)

    def active_attempts(self, name: str | None = None) -> set[str]:
        """The attempts that have not ended (on host `name`, or anywhere): the ones that may
        still be running. A container sweep keeps every one of them, wherever the store thinks
        it runs: a host registered twice, or re-added under another name, is still one box."""
        placeholders, params = expand("state", [s.value for s in RunState if not s.terminal])
        on_host = " AND target = :name" if name is not None else ""
        with self._read() as tx:
            rows = tx.all(
                f"SELECT id FROM attempts WHERE state IN ({placeholders}){on_host}",
                {**params, "name": name},
            )
        return {r["id"] for r in rows}

    def remove(self, name: str, actor: str) -> None:
        self.get(name)  # never a cluster of the same table
        with self._write() as tx:
            if tx.execute("DELETE FROM hosts WHERE name = :name", {"name": name}) != 1:
                raise unknown(name)
            append_event(tx, actor, "host.removed", host=name)
