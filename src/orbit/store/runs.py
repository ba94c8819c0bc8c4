"""Runs and their attempts in the store: a new run with its first attempt, a new attempt of a
run whose last has ended (each claimed for launching in the transaction that makes it when
asked), and runs read by id, prefix or filter. How an attempt's state changes:
orbit.store.attempt_states."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orbit.model.errors import InvalidInput, NotFound
from orbit.model.models import ExecutionRequest, RunState, TaskSubmission
from orbit.model.policies import PolicyStamp
from orbit.model.records import AttemptRecord, RunRecord
from orbit.store import base
from orbit.store.attempt_leases import Lease, set_launch_claim
from orbit.store.attempt_states import insert_attempt
from orbit.store.audit import append_event
from orbit.store.base import Part, utcnow
from orbit.store.dependencies import write_dependencies
from orbit.store.drivers import Conflict
from orbit.store.run_queries import (
    ATTEMPT_COLUMNS,
    RUN_COLUMNS,
    RUNS_FROM,
    attempt_record,
    resolve,
    run_records,
    runs_filter,
)
from orbit.store.sql import Tx, expand, read_json, read_time
from orbit.store.submit_keys import SubmitKey, remember


@dataclass(frozen=True)
class NewRun:
    """What a new run is made of (see insert_run)."""

    experiment_id: str
    task_type: str
    template_id: str
    bundle_digest: str
    submission: TaskSubmission
    request: ExecutionRequest
    policy: PolicyStamp | None = None


def insert_run(
    tx: Tx,
    run_id: str,
    run: NewRun,
    actor: str,
    launcher: Lease | None,
    replay_of: str | None = None,
    group_id: str | None = None,
    created_at: datetime | None = None,
) -> None:
    """Write a new run with its first attempt, in state prepared, and audit it; with
    `launcher`, claimed for launching by it in the same transaction. `created_at`: now, or
    a time that keeps a group's runs in order."""
    tx.execute(
        "INSERT INTO runs (id, experiment_id, task_type, template_id, bundle_digest, "
        "submission, request, created_at, created_by, replay_of, policy, group_id) VALUES (:id, "
        ":experiment_id, :task_type, :template_id, :bundle_digest, :submission, "
        ":request, :created_at, :created_by, :replay_of, :policy, :group_id)",
        {
            "id": run_id,
            "experiment_id": run.experiment_id,
            "task_type": run.task_type,
            "template_id": run.template_id,
            "bundle_digest": run.bundle_digest,
            "submission": run.submission.model_dump(mode="json"),
            "request": run.request.model_dump(mode="json"),
            "created_at": created_at or utcnow(),
            "created_by": actor,
            "replay_of": replay_of,
            "policy": run.policy.model_dump(mode="json") if run.policy is not None else None,
            "group_id": group_id,
        },
    )
    extra = {"group_id": group_id} if group_id is not None else {}
    append_event(
        tx,
        actor,
        "run.created",
        run_id=run_id,
        bundle_digest=run.bundle_digest,
        template_id=run.template_id,
        task_type=run.task_type,
        **extra,
    )
    write_dependencies(tx, run_id, run.submission.after)
    request = run.request
    attempt_id = insert_attempt(tx, run_id, 1, request.target, request.backend_key, "submit", actor)
    set_launch_claim(tx, attempt_id, launcher=launcher, not_before=None)


class Runs(Part):
    """Runs and their attempts: written when submitted and retried, read by id, prefix or
    filter (orbit.store.run_queries holds the queries' SQL and the rows' records)."""

    def resolve_run_id(self, ref: str) -> str:
        """A full run id, or a unique prefix of one (at least 4 characters after `run-`)."""
        with self._read() as tx:
            return resolve(tx, ref)

    def get_attempt(self, attempt_id: str) -> AttemptRecord:
        with self._read() as tx:
            row = tx.one(
                f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE id = :id", {"id": attempt_id}
            )
        if row is None:
            raise NotFound(f"unknown attempt '{attempt_id}'")
        return attempt_record(row)

    def get_run(self, ref: str) -> RunRecord:
        """A run by id or unique prefix, with all its attempts."""
        with self._read() as tx:
            run_id = resolve(tx, ref)
            row = tx.one(f"SELECT {RUN_COLUMNS} FROM {RUNS_FROM} WHERE r.id = :id", {"id": run_id})
            assert row is not None
            return run_records(tx, [row])[0]

    def list_runs(
        self,
        *,
        experiment_id: str | None = None,
        states: set[RunState] | None = None,
        limit: int | None = None,
        user: str | None = None,
        node: str | None = None,
        template_id: str | None = None,
        text: str | None = None,
        before: tuple[datetime, str] | None = None,
        viewer: str | None = None,
        group_id: str | None = None,
    ) -> list[RunRecord]:
        """Newest first. `states` and `node` filter on each run's current attempt, `user` on
        who submitted it (the others: see runs_filter)."""
        condition, params = runs_filter(
            experiment_id, states, user, node, template_id, text, before, viewer, group_id
        )
        page = " LIMIT :limit" if limit is not None else ""
        with self._read() as tx:
            rows = tx.all(
                f"SELECT {RUN_COLUMNS} FROM {RUNS_FROM}{condition} "
                f"ORDER BY r.created_at DESC, r.id{page}",
                {**params, "limit": limit},
            )
            return run_records(tx, rows)

    def count_runs(
        self,
        experiment_id: str | None = None,
        states: set[RunState] | None = None,
        user: str | None = None,
        node: str | None = None,
        template_id: str | None = None,
        text: str | None = None,
        before: tuple[datetime, str] | None = None,
        viewer: str | None = None,
        group_id: str | None = None,
        cap: int | None = None,
    ) -> int:
        """How many runs `list_runs` would list with the same filters and no limit; with
        `cap`, counted no further than cap + 1 (a page that says "more than 1,000" need not
        count 100,000)."""
        condition, params = runs_filter(
            experiment_id, states, user, node, template_id, text, before, viewer, group_id
        )
        query = f"SELECT count(*) FROM runs r{condition}"
        if cap is not None:
            query = f"SELECT count(*) FROM (SELECT 1 FROM runs r{condition} LIMIT :cap) x"
            params = {**params, "cap": cap + 1}
        with self._read() as tx:
            count = tx.scalar(query, params)
        return int(count or 0)

    def change_stamp(self) -> str:
        """What changes whenever any run's attempt moves or a run is made: the newest attempt
        update (the console's live parts ask once a second, for all who listen)."""
        with self._read() as tx:
            newest = tx.scalar("SELECT max(updated_at) FROM attempts")
        return str(newest or "")

    def holding(self, states: set[RunState]) -> list[tuple[str, str, Any]]:
        """(user, experiment, request) of every current attempt in `states` (a gang's once):
        who holds what now, by the attempts' state index rather than a walk of every run."""
        marks, params = expand("state", sorted(s.value for s in states))
        with self._read() as tx:
            rows = tx.all(
                "SELECT r.created_by, e.name, r.request FROM attempts a "
                "JOIN runs r ON r.id = a.run_id JOIN experiments e ON e.id = r.experiment_id "
                f"WHERE a.state IN ({marks}) AND a.gang_of IS NULL",
                params,
            )
        return [(row["created_by"], row["name"], read_json(row["request"])) for row in rows]

    def gpu_time(self, since: datetime, until: datetime) -> list[tuple[str, str, Any, Any, Any]]:
        """(user, experiment, request, started_at, finished_at) of every attempt that ran at
        some time between `since` and `until` (a gang's once, by its rank 0): what GPU-hours
        per user and experiment are counted from (the console's fair share)."""
        with self._read() as tx:
            rows = tx.all(
                "SELECT r.created_by, e.name, r.request, a.started_at, a.finished_at "
                "FROM attempts a JOIN runs r ON r.id = a.run_id "
                "JOIN experiments e ON e.id = r.experiment_id "
                "WHERE a.gang_of IS NULL AND a.started_at IS NOT NULL AND a.started_at < :until "
                "AND (a.finished_at IS NULL OR a.finished_at > :since)",
                {"since": since, "until": until},
            )
        return [
            (
                row["created_by"],
                row["name"],
                read_json(row["request"]),
                read_time(row["started_at"]),
                read_time(row["finished_at"]),
            )
            for row in rows
        ]

    def select_runs(
        self,
        *,
        experiment_id: str | None,
        states: set[RunState] | None,
        user: str | None,
        limit: int,
        viewer: str | None = None,
        group_id: str | None = None,
    ) -> list[RunRecord]:
        """Newest first, at most `limit`; `viewer` and `group_id`: as runs_filter's."""
        condition, params = runs_filter(experiment_id, states, viewer=viewer, group_id=group_id)
        if user is not None:
            joiner = " AND " if " WHERE " in condition else " WHERE "
            condition += f"{joiner}r.created_by = :user"
        with self._read() as tx:
            rows = tx.all(
                f"SELECT {RUN_COLUMNS} FROM {RUNS_FROM}{condition} "
                "ORDER BY r.created_at DESC, r.id LIMIT :limit",
                {**params, "user": user, "limit": limit},
            )
            return run_records(tx, rows)

    def create_run(
        self,
        *,
        experiment_id: str,
        task_type: str,
        template_id: str,
        bundle_digest: str,
        submission: TaskSubmission,
        request: ExecutionRequest,
        actor: str,
        replay_of: str | None = None,
        launcher: Lease | None = None,
        key: SubmitKey | None = None,
        policy: PolicyStamp | None = None,
    ) -> RunRecord:
        """A new run with its first attempt, in state prepared; with `launcher`, claimed for
        launching by it in the same transaction (no other process can launch it first); with
        `key`, that idempotency key written for it there too (KeyTaken if another run has it:
        then nothing is written)."""
        run = NewRun(
            experiment_id, task_type, template_id, bundle_digest, submission, request, policy
        )
        run_id = base.new_id("run")
        with self._write() as tx:
            if key is not None:  # first: a retry that lost the race writes nothing else
                remember(tx, key, run_id)
            insert_run(tx, run_id, run, actor, launcher, replay_of)
        return self.get_run(run_id)

    def add_attempt(
        self,
        run_id: str,
        *,
        target: str | None,
        backend_key: str,
        trigger: str,
        actor: str,
        not_before: datetime | None = None,
        launcher: Lease | None = None,
    ) -> AttemptRecord:
        """A new attempt of the run's bundle, once the current one has ended; with
        `not_before`, it is not to be launched before then (a retry's backoff); with
        `launcher`, it is claimed for launching by it in the same transaction."""
        number = 0
        try:
            with self._write() as tx:
                last = tx.one(
                    "SELECT number, state FROM attempts WHERE run_id = :run_id AND rank = 0 "
                    "ORDER BY number DESC LIMIT 1",
                    {"run_id": run_id},
                )
                if last is None:
                    raise NotFound(f"unknown run '{run_id}'")
                if not RunState(last["state"]).terminal:
                    raise InvalidInput(
                        f"run {run_id} is still {last['state']}: cancel it before retrying"
                    )
                number = last["number"] + 1
                attempt_id = insert_attempt(tx, run_id, number, target, backend_key, trigger, actor)
                set_launch_claim(tx, attempt_id, launcher=launcher, not_before=not_before)
        except Conflict:  # another process added attempt `number` first
            raise InvalidInput(
                f"run {run_id} already has a new attempt {number}: another retry was first"
            ) from None
        return self.get_attempt(attempt_id)
