"""Slurm clusters in the store: rows of the `hosts` table whose spec says `kind: slurm` (a
cluster is a place runs go, reached as a host is, with what its last check found; one name
space with the hosts, so a target names one thing). Add, read, record a check, remove; each
audited."""

from __future__ import annotations

from orbit.model.clusters import ClusterFacts, ClusterRecord, ClusterSpec
from orbit.model.errors import InvalidInput, NotFound
from orbit.model.models import RunState
from orbit.store.audit import append_event
from orbit.store.base import Part, utcnow
from orbit.store.drivers import Conflict
from orbit.store.host_table import HOST_COLUMNS, is_cluster
from orbit.store.sql import Row, expand, read_json, read_time_required


def already_exists(name: str) -> InvalidInput:
    return InvalidInput(
        f"name '{name}' is taken by a cluster or a host (orbit clusters list, orbit hosts list)"
    )


def unknown(name: str) -> NotFound:
    return NotFound(f"unknown cluster '{name}' (see 'orbit clusters list')")


def cluster_record(row: Row) -> ClusterRecord:
    facts = read_json(row["facts"])
    return ClusterRecord(
        spec=ClusterSpec.model_validate(read_json(row["spec"])),
        facts=ClusterFacts.model_validate(facts) if facts else None,
        created_at=read_time_required(row["created_at"]),
        created_by=row["created_by"],
    )


class ClusterTable(Part):
    def add(self, spec: ClusterSpec, facts: ClusterFacts | None, actor: str) -> ClusterRecord:
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
                where = "local" if spec.local else (spec.ssh.ssh if spec.ssh else "")
                append_event(tx, actor, "cluster.added", cluster=spec.name, at=where)
        except Conflict:  # a host or cluster of that name, or another add won the race
            raise already_exists(spec.name) from None
        return self.get(spec.name)

    def find(self, name: str) -> ClusterRecord | None:
        with self._read() as tx:
            row = tx.one(f"SELECT {HOST_COLUMNS} FROM hosts WHERE name = :name", {"name": name})
        return cluster_record(row) if row is not None and is_cluster(row) else None

    def taken(self, name: str) -> bool:
        with self._read() as tx:
            return tx.one("SELECT name FROM hosts WHERE name = :name", {"name": name}) is not None

    def get(self, name: str) -> ClusterRecord:
        found = self.find(name)
        if found is None:
            raise unknown(name)
        return found

    def all(self) -> list[ClusterRecord]:
        with self._read() as tx:
            rows = tx.all(f"SELECT {HOST_COLUMNS} FROM hosts ORDER BY name")
        return [cluster_record(r) for r in rows if is_cluster(r)]

    def set_facts(self, name: str, facts: ClusterFacts, actor: str) -> ClusterRecord:
        self.get(name)
        with self._write() as tx:
            tx.execute(
                "UPDATE hosts SET facts = :facts WHERE name = :name",
                {"facts": facts.model_dump(mode="json"), "name": name},
            )
            append_event(
                tx,
                actor,
                "cluster.checked",
                cluster=name,
                version=facts.version,
                partitions=[p.name for p in facts.partitions],
                gpus=sum(sum(n.gpus.values()) for n in facts.nodes),
            )
        return self.get(name)

    def active_attempts(self, name: str | None = None) -> set[str]:
        """The attempts that have not ended (on cluster `name`, or anywhere)."""
        placeholders, params = expand("state", [s.value for s in RunState if not s.terminal])
        on = " AND target = :name" if name is not None else ""
        with self._read() as tx:
            rows = tx.all(
                f"SELECT id FROM attempts WHERE state IN ({placeholders}){on}",
                {**params, "name": name},
            )
        return {r["id"] for r in rows}

    def remove(self, name: str, actor: str) -> None:
        self.get(name)
        with self._write() as tx:
            tx.execute("DELETE FROM hosts WHERE name = :name", {"name": name})
            append_event(tx, actor, "cluster.removed", cluster=name)
