"""Experiments in the store: create one (audited), find one, list them with their run counts."""

from __future__ import annotations

import re

from orbit.model.errors import InvalidInput, NotFound
from orbit.model.models import NAME_PATTERN
from orbit.model.records import ExperimentRecord
from orbit.store.audit import append_event
from orbit.store.base import Part, new_id, utcnow
from orbit.store.drivers import Conflict
from orbit.store.sql import read_time_required


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
                "SELECT id, name, created_at FROM experiments WHERE name = :ref OR id = :ref "
                "ORDER BY name = :ref DESC LIMIT 1",
                {"ref": name_or_id},
            )
            if row is None:
                return None
            count = tx.scalar(
                "SELECT count(*) FROM runs WHERE experiment_id = :id", {"id": row["id"]}
            )
        return ExperimentRecord(
            id=row["id"],
            name=row["name"],
            created_at=read_time_required(row["created_at"]),
            run_count=count or 0,
        )

    def get_experiment(self, name_or_id: str) -> ExperimentRecord:
        found = self.find_experiment(name_or_id)
        if found is None:
            raise NotFound(f"unknown experiment '{name_or_id}' (see 'orbit experiments list')")
        return found

    def list_experiments(self) -> list[ExperimentRecord]:
        """Oldest first, each with its number of runs."""
        with self._read() as tx:
            rows = tx.all(
                "SELECT e.id, e.name, e.created_at, "
                "(SELECT count(*) FROM runs r WHERE r.experiment_id = e.id) AS run_count "
                "FROM experiments e ORDER BY e.created_at, e.id"
            )
        return [
            ExperimentRecord(
                id=r["id"],
                name=r["name"],
                created_at=read_time_required(r["created_at"]),
                run_count=r["run_count"],
            )
            for r in rows
        ]
