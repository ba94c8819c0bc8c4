"""Experiments in the store: create one (audited), find one, list them with their run counts;
restrict one to its members (audited, as each member added or removed), and the restricted
ones a user may not see."""

from __future__ import annotations

import re

from orbit.model.errors import InvalidInput, NotFound
from orbit.model.models import NAME_PATTERN
from orbit.model.records import ExperimentRecord
from orbit.store.audit import append_event
from orbit.store.base import Part, new_id, utcnow
from orbit.store.drivers import Conflict
from orbit.store.run_queries import HIDDEN
from orbit.store.sql import Tx, expand, read_time_required


def check_experiment_name(name: str) -> None:
    if not re.fullmatch(NAME_PATTERN, name):
        raise InvalidInput(
            f"experiment name '{name}': use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )


class Experiments(Part):
    def create_experiment(self, name: str, actor: str) -> ExperimentRecord:
        check_experiment_name(name)
        record = ExperimentRecord(id=new_id("exp"), name=name, created_at=utcnow())
        try:
            with self._write() as tx:
                tx.execute(
                    "INSERT INTO experiments (id, name, created_at) VALUES (:id, :name, :at)",
                    {"id": record.id, "name": name, "at": record.created_at},
                )
                append_event(tx, actor, "experiment.created", experiment_id=record.id, name=name)
        except Conflict:
            raise InvalidInput(f"experiment '{name}' already exists") from None
        return record

    def find_experiment(self, name_or_id: str) -> ExperimentRecord | None:
        with self._read() as tx:
            row = tx.one(
                "SELECT id, name, created_at, restricted FROM experiments "
                "WHERE name = :ref OR id = :ref ORDER BY name = :ref DESC LIMIT 1",
                {"ref": name_or_id},
            )
            if row is None:
                return None
            count = tx.scalar(
                "SELECT count(*) FROM runs WHERE experiment_id = :id", {"id": row["id"]}
            )
            members = _members(tx).get(row["id"], [])
        return ExperimentRecord(
            id=row["id"],
            name=row["name"],
            created_at=read_time_required(row["created_at"]),
            run_count=count or 0,
            restricted=bool(row["restricted"]),
            members=members,
        )

    def get_experiment(self, name_or_id: str) -> ExperimentRecord:
        found = self.find_experiment(name_or_id)
        if found is None:
            raise NotFound(f"unknown experiment '{name_or_id}' (see 'orbit experiments list')")
        return found

    def list_experiments(self, viewer: str | None = None) -> list[ExperimentRecord]:
        """Oldest first, each with its number of runs; `viewer`: leave out the restricted
        ones that user is not a member of."""
        hidden = self.hidden_from(viewer) if viewer is not None else set()
        with self._read() as tx:
            rows = tx.all(
                "SELECT e.id, e.name, e.created_at, e.restricted, "
                "(SELECT count(*) FROM runs r WHERE r.experiment_id = e.id) AS run_count "
                "FROM experiments e ORDER BY e.created_at, e.id"
            )
            members = _members(tx)
        return [
            ExperimentRecord(
                id=r["id"],
                name=r["name"],
                created_at=read_time_required(r["created_at"]),
                run_count=r["run_count"],
                restricted=bool(r["restricted"]),
                members=members.get(r["id"], []),
            )
            for r in rows
            if r["id"] not in hidden
        ]

    def hidden_from(self, user: str) -> set[str]:
        """The ids of the restricted experiments `user` is not a member of."""
        with self._read() as tx:
            rows = tx.all(HIDDEN, {"viewer": user})
        return {r["id"] for r in rows}

    def hidden_runs(self, user: str, run_ids: list[str]) -> set[str]:
        """Which of `run_ids` belong to restricted experiments `user` is not a member of."""
        ids, found = sorted(set(run_ids)), set[str]()
        with self._read() as tx:
            for start in range(0, len(ids), 500):  # within any driver's count of parameters
                marks, params = expand("run", ids[start : start + 500])
                rows = tx.all(
                    f"SELECT id FROM runs WHERE id IN ({marks}) AND experiment_id IN ({HIDDEN})",
                    {**params, "viewer": user},
                )
                found.update(str(r["id"]) for r in rows)
        return found

    def restrict(self, name_or_id: str, restricted: bool, actor: str) -> ExperimentRecord:
        """Mark an experiment restricted (only its members see its runs) or open again."""
        found = self.get_experiment(name_or_id)
        with self._write() as tx:
            tx.execute(
                "UPDATE experiments SET restricted = :on WHERE id = :id",
                {"on": restricted, "id": found.id},
            )
            if found.restricted != restricted:
                what = "experiment.restricted" if restricted else "experiment.opened"
                append_event(tx, actor, what, experiment_id=found.id, name=found.name)
        return self.get_experiment(found.id)

    def set_member(self, name_or_id: str, user: str, member: bool, actor: str) -> ExperimentRecord:
        """Add `user` to an experiment's members, or remove them (audited either way)."""
        found = self.get_experiment(name_or_id)
        with self._write() as tx:
            if member and user not in found.members:
                tx.execute(
                    "INSERT INTO experiment_members (experiment_id, user_name, added_at, "
                    "added_by) VALUES (:id, :user, :at, :by)",
                    {"id": found.id, "user": user, "at": utcnow(), "by": actor},
                )
                append_event(
                    tx, actor, "experiment.member_added", experiment_id=found.id, user=user
                )
            elif not member and user in found.members:
                tx.execute(
                    "DELETE FROM experiment_members WHERE experiment_id = :id AND "
                    "user_name = :user",
                    {"id": found.id, "user": user},
                )
                append_event(
                    tx, actor, "experiment.member_removed", experiment_id=found.id, user=user
                )
        return self.get_experiment(found.id)


def _members(tx: Tx) -> dict[str, list[str]]:
    members: dict[str, list[str]] = {}
    for row in tx.all("SELECT experiment_id, user_name FROM experiment_members ORDER BY 2"):
        members.setdefault(row["experiment_id"], []).append(row["user_name"])
    return members
