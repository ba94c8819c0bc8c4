"""Run groups in the store: a sweep's runs are written with their group in one transaction (all
of them or none), and groups read with their runs' counts by state."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from orbit.model.errors import InvalidInput, NotFound
from orbit.model.groups import RunGroup
from orbit.model.states import RunState
from orbit.model.sweeps import Sweep
from orbit.store import base
from orbit.store.attempt_leases import Lease
from orbit.store.audit import append_event
from orbit.store.base import Part, utcnow
from orbit.store.run_queries import HIDDEN
from orbit.store.runs import NewRun, insert_run
from orbit.store.sql import Row, Tx, expand, ids_by_prefix, read_time_required
from orbit.store.submit_keys import SubmitKey, remember

GROUP_COLUMNS = (
    "g.id, g.experiment_id, e.name AS experiment_name, g.created_at, g.created_by, g.size, g.sweep"
)
GROUPS_FROM = "run_groups g JOIN experiments e ON e.id = g.experiment_id"


class Groups(Part):
    def create_group(
        self,
        *,
        experiment_id: str,
        sweep: Sweep,
        runs: list[NewRun],
        actor: str,
        launcher: Lease | None = None,
        key: SubmitKey | None = None,
    ) -> tuple[str, list[str]]:
        """A group and its runs (each with its first attempt, claimed by `launcher`), in one
        transaction: all of them are written, or none. With `key`, that idempotency key names
        the group's first run (KeyTaken if another run has it: then nothing is written)."""
        group_id = base.new_id("grp")
        run_ids = [base.new_id("run") for _ in runs]
        at = utcnow()
        with self._write() as tx:
            if key is not None:
                remember(tx, key, run_ids[0])
            tx.execute(
                "INSERT INTO run_groups (id, experiment_id, created_at, created_by, size, sweep) "
                "VALUES (:id, :experiment_id, :at, :by, :size, :sweep)",
                {
                    "id": group_id,
                    "experiment_id": experiment_id,
                    "at": at,
                    "by": actor,
                    "size": len(runs),
                    "sweep": sweep.model_dump(mode="json"),
                },
            )
            append_event(tx, actor, "group.created", group_id=group_id, size=len(runs))
            # a microsecond apart each: a listing's newest first is the sweep's order reversed
            for index, (run_id, run) in enumerate(zip(run_ids, runs, strict=True)):
                made = at + timedelta(microseconds=index)
                insert_run(tx, run_id, run, actor, launcher, group_id=group_id, created_at=made)
        return group_id, run_ids

    def resolve_group_id(self, ref: str) -> str:
        """A full group id, or a unique prefix of one (at least 4 characters after `grp-`)."""
        with self._read() as tx:
            return _resolve(tx, ref)

    def get_group(self, ref: str) -> RunGroup:
        with self._read() as tx:
            group_id = _resolve(tx, ref)
            row = tx.one(
                f"SELECT {GROUP_COLUMNS} FROM {GROUPS_FROM} WHERE g.id = :id", {"id": group_id}
            )
            assert row is not None
            return _records(tx, [row])[0]

    def list_groups(
        self,
        *,
        experiment_id: str | None = None,
        user: str | None = None,
        viewer: str | None = None,
        limit: int = 50,
    ) -> list[RunGroup]:
        """Newest first; `viewer`: not the groups of restricted experiments that user is not a
        member of."""
        clauses, params = [], {"experiment_id": experiment_id, "user": user, "limit": limit}
        if experiment_id is not None:
            clauses.append("g.experiment_id = :experiment_id")
        if user is not None:
            clauses.append("g.created_by = :user")
        if viewer is not None:
            clauses.append(f"g.experiment_id NOT IN ({HIDDEN})")
            params["viewer"] = viewer
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._read() as tx:
            rows = tx.all(
                f"SELECT {GROUP_COLUMNS} FROM {GROUPS_FROM}{where} "
                "ORDER BY g.created_at DESC, g.id LIMIT :limit",
                params,
            )
            return _records(tx, rows)

    def group_runs(self, group_id: str) -> list[str]:
        """The group's runs, in the order the sweep made them."""
        with self._read() as tx:
            rows = tx.all(
                "SELECT r.id FROM runs r WHERE r.group_id = :id ORDER BY r.created_at, r.id",
                {"id": group_id},
            )
        return [r["id"] for r in rows]


def _records(tx: Tx, rows: list[Row]) -> list[RunGroup]:
    if not rows:
        return []
    placeholders, params = expand("group", [r["id"] for r in rows])
    counts: dict[str, dict[str, int]] = {r["id"]: {} for r in rows}
    for c in tx.all(
        f"SELECT group_id, state, count(*) AS n FROM runs WHERE group_id IN ({placeholders}) "
        "GROUP BY group_id, state",
        params,
    ):
        counts[c["group_id"]][c["state"]] = int(c["n"])
    order = [s.value for s in RunState]
    return [
        RunGroup(
            id=r["id"],
            experiment_id=r["experiment_id"],
            experiment_name=r["experiment_name"],
            created_at=read_time_required(r["created_at"]),
            created_by=r["created_by"],
            size=r["size"],
            sweep=Sweep.model_validate(_json(r["sweep"])),
            counts={s: counts[r["id"]][s] for s in order if s in counts[r["id"]]},
        )
        for r in rows
    ]


def _json(raw: Any) -> Any:
    return json.loads(raw) if isinstance(raw, str) else raw


def _resolve(tx: Tx, ref: str) -> str:
    if tx.scalar("SELECT id FROM run_groups WHERE id = :id", {"id": ref}) is not None:
        return ref
    prefix = ref if ref.startswith("grp-") else f"grp-{ref}"
    if len(prefix) >= len("grp-") + 4:
        ids = ids_by_prefix(tx, "run_groups", prefix)
        if len(ids) == 1:
            return ids[0]
        if len(ids) > 1:
            raise InvalidInput(
                f"group id '{ref}' is ambiguous: it matches {', '.join(ids[:5])} "
                "(give more characters)"
            )
    raise NotFound(f"unknown group '{ref}' (see 'orbit groups list')")
