"""How runs and attempts are read (orbit.store.runs asks): the columns, the filters of `runs
list`, a run by id or prefix, and rows made records.

Each read is a few indexed queries in one read transaction: a page of runs reads the attempts
of that page only."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from orbit.model.errors import InvalidInput, NotFound
from orbit.model.models import (
    ExecutionRequest,
    FailureReason,
    RunHandle,
    RunState,
    TaskSubmission,
)
from orbit.model.policies import PolicyStamp
from orbit.model.records import AttemptRecord, RunRecord
from orbit.store.sql import (
    Row,
    Tx,
    expand,
    ids_by_prefix,
    like_prefix,
    read_json,
    read_time,
    read_time_required,
)

ATTEMPT_COLUMNS = (
    'id, run_id, number, state, reason, target, backend_key, "trigger", handle, exit_code, '
    "message, cancel_requested, created_at, updated_at, started_at, finished_at, "
    "last_contact_at, unreachable_since, lease_owner, lease_expires_at, not_before, preempted_by, "
    "held, (SELECT n.name FROM nodes n WHERE n.id = attempts.node_id) AS node_name"
)
RUN_COLUMNS = (
    "r.id, r.experiment_id, e.name AS experiment_name, r.task_type, r.template_id, "
    "r.bundle_digest, r.submission, r.request, r.created_at, r.created_by, r.replay_of, "
    "r.policy, r.group_id"
)
RUNS_FROM = "runs r JOIN experiments e ON e.id = r.experiment_id"
AMBIGUOUS_SHOWN = 5  # matches named when a run id prefix is ambiguous


def stored_request(raw: str | dict[str, Any]) -> ExecutionRequest:
    """A run's request as its column holds it (JSON text, or already a dict where the driver
    reads JSON): the one place a stored request becomes its record again."""
    if isinstance(raw, str):
        return ExecutionRequest.model_validate_json(raw)
    return ExecutionRequest.model_validate(raw)


def stored_policy(raw: str | dict[str, Any] | None) -> PolicyStamp | None:
    """What a run recorded of its admission, as its column holds it (none before 0017)."""
    if raw is None:
        return None
    if isinstance(raw, str):
        return PolicyStamp.model_validate_json(raw)
    return PolicyStamp.model_validate(raw)


def stored_submission(raw: str | dict[str, Any]) -> TaskSubmission:
    """A run's submission as its column holds it, as stored_request."""
    if isinstance(raw, str):
        return TaskSubmission.model_validate_json(raw)
    return TaskSubmission.model_validate(raw)


def with_request(rows: list[Row]) -> list[Row]:
    """`rows` that join their run's request (and its submission, where they read it), each
    holding them as their records."""
    for row in rows:
        row["request"] = stored_request(row["request"])
        if "submission" in row:
            row["submission"] = stored_submission(row["submission"])
    return rows


def attempt_record(row: Row) -> AttemptRecord:
    """An attempt as the store wrote it. Built without validating again what the store wrote
    and converts here field by field: reading many runs stays cheap."""
    handle = read_json(row["handle"])  # NULL, or JSON null where SQLAlchemy was given None
    return AttemptRecord.model_construct(
        id=row["id"],
        run_id=row["run_id"],
        number=row["number"],
        state=RunState(row["state"]),
        reason=FailureReason(row["reason"]) if row["reason"] else None,
        target=row["target"],
        backend_key=row["backend_key"],
        trigger=row["trigger"],
        handle=RunHandle.model_construct(**handle) if handle else None,
        exit_code=row["exit_code"],
        message=row["message"],
        cancel_requested=bool(row["cancel_requested"]),
        created_at=read_time_required(row["created_at"]),
        updated_at=read_time_required(row["updated_at"]),
        started_at=read_time(row["started_at"]),
        finished_at=read_time(row["finished_at"]),
        last_contact_at=read_time(row["last_contact_at"]),
        unreachable_since=read_time(row["unreachable_since"]),
        lease_owner=row["lease_owner"],
        lease_expires_at=read_time(row["lease_expires_at"]),
        not_before=read_time(row["not_before"]),
        preempted_by=row["preempted_by"],
        held=row["held"],
        node=row["node_name"],
    )


def ambiguous(ref: str, matches: list[str]) -> InvalidInput:
    named = ", ".join(matches[:AMBIGUOUS_SHOWN])
    more = len(matches) - AMBIGUOUS_SHOWN
    if more > 0:
        named += f" and {more} more"
    return InvalidInput(f"run id '{ref}' is ambiguous: it matches {named} (give more characters)")


@dataclass(frozen=True)
class RunFilter:
    """Which runs a listing takes: an experiment's, in some states (of their current
    attempt), submitted by a user, on a node, of a template, whose id or experiment holds a
    text; `before`: only those listed after a run (its created_at and id), for the next page
    of a listing newest first (see runs_filter)."""

    experiment_id: str | None = None
    states: set[RunState] | None = None
    user: str | None = None
    node: str | None = None
    template_id: str | None = None
    text: str | None = None
    before: tuple[datetime, str] | None = None
    viewer: str | None = None  # leave out the restricted experiments this user is not in
    group_id: str | None = None  # the runs of one group (a sweep's)

    def but(self, **changes: Any) -> RunFilter:
        return replace(self, **changes)

    def query(self) -> dict[str, Any]:
        """As list_runs' and count_runs' keywords."""
        return {
            "experiment_id": self.experiment_id,
            "states": self.states,
            "user": self.user,
            "node": self.node,
            "template_id": self.template_id,
            "text": self.text,
            "before": self.before,
            "viewer": self.viewer,
            "group_id": self.group_id,
        }


# the restricted experiments a viewer is not a member of
HIDDEN = (
    "SELECT x.id FROM experiments x WHERE x.restricted AND NOT EXISTS (SELECT 1 FROM "
    "experiment_members m WHERE m.experiment_id = x.id AND m.user_name = :viewer)"
)


def runs_filter(
    experiment_id: str | None,
    states: set[RunState] | None,
    user: str | None = None,
    node: str | None = None,
    template_id: str | None = None,
    text: str | None = None,
    before: tuple[datetime, str] | None = None,
    viewer: str | None = None,
    group_id: str | None = None,
) -> tuple[str, dict[str, object]]:
    """The WHERE clause shared by list_runs and count_runs (runs are `r`). `states` filters on
    each run's current attempt, its highest number (the copy of its state in runs.state,
    ix_runs_state_created_at); `user` on who submitted it (ix_runs_created_by_created_at);
    `node` on where its current attempt is: an agent node by name or id (attempts.node_id, any
    rank of a gang), or a host, cluster or pinned node by name (ix_attempts_target); `text` on
    a run id it begins, or an experiment name holding it; `before`: runs after that one in the
    order newest first (created_at DESC, id); `viewer`: not the runs of a restricted
    experiment that user is not a member of; `group_id`: the runs of that group."""
    clauses: list[str] = []
    params: dict[str, object] = {"experiment_id": experiment_id, "user": user, "node": node}
    if template_id is not None:
        clauses.append("r.template_id = :template_id")
        params["template_id"] = template_id
    if text:
        # a run id by its start (a range on the primary key: no scan), or an experiment
        # whose name holds the text (any case)
        ident = text if text.startswith("run-") else f"run-{text}"
        clauses.append(
            "((r.id >= :text_lo AND r.id < :text_hi) OR r.experiment_id IN (SELECT x.id FROM "
            "experiments x WHERE lower(x.name) LIKE :text ESCAPE '\\'))"
        )
        params.update(
            text_lo=ident,
            text_hi=ident[:-1] + chr(ord(ident[-1]) + 1),
            text="%" + like_prefix(text.lower()),
        )
    if before is not None:
        clauses.append(
            "(r.created_at < :before_at OR (r.created_at = :before_at AND r.id > :before_id))"
        )
        params.update(before_at=before[0], before_id=before[1])
    if experiment_id is not None:
        clauses.append("r.experiment_id = :experiment_id")
    if group_id is not None:
        clauses.append("r.group_id = :group_id")
        params["group_id"] = group_id
    if viewer is not None:
        clauses.append(f"r.experiment_id NOT IN ({HIDDEN})")
        params["viewer"] = viewer
    if user is not None:
        clauses.append("r.created_by = :user")
    if node is not None:
        clauses.append(
            "r.id IN (SELECT x.run_id FROM attempts x WHERE (x.node_id IN (SELECT n.id FROM "
            "nodes n WHERE n.name = :node OR n.id = :node) OR x.target = :node) AND x.number = "
            "(SELECT max(y.number) FROM attempts y WHERE y.run_id = x.run_id))"
        )
    if states:
        placeholders, values = expand("state", sorted(s.value for s in states))
        params.update(values)
        clauses.append(f"r.state IN ({placeholders})")
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    return where, params


def resolve(tx: Tx, ref: str) -> str:
    """The run id `ref` names in full or by a unique prefix."""
    if tx.scalar("SELECT id FROM runs WHERE id = :id", {"id": ref}) is not None:
        return ref
    candidates = [ref, f"run-{ref}"] if not ref.startswith("run-") else [ref]
    for prefix in candidates:
        if len(prefix) < len("run-") + 4:
            continue
        ids = ids_by_prefix(tx, "runs", prefix)
        if len(ids) == 1:
            return ids[0]
        if len(ids) > 1:
            raise ambiguous(ref, ids)
    raise NotFound(f"unknown run '{ref}' (see 'orbit runs list')")


def run_records(tx: Tx, rows: list[Row]) -> list[RunRecord]:
    """The runs of `rows`, each with its attempts (a gang's leader with its other nodes)."""
    if not rows:
        return []
    placeholders, params = expand("run", [r["id"] for r in rows])
    attempts: dict[str, list[AttemptRecord]] = {r["id"]: [] for r in rows}
    ranks: dict[str, list[str]] = {}  # a gang's leader -> its other nodes, by rank
    leaders: list[Row] = []
    for a in tx.all(  # leaders and gang members in one read: rank 0 comes first
        f"SELECT {ATTEMPT_COLUMNS}, gang_of FROM attempts WHERE run_id IN ({placeholders}) "
        "ORDER BY run_id, number, rank",
        params,
    ):
        if a["gang_of"] is None:
            leaders.append(a)
        elif a["node_name"] is not None:
            ranks.setdefault(a["gang_of"], []).append(a["node_name"])
    for a in leaders:
        record = attempt_record(a)
        if a["id"] in ranks and record.node is not None:
            record = record.model_copy(update={"gang_nodes": (record.node, *ranks[a["id"]])})
        attempts[a["run_id"]].append(record)
    return [
        RunRecord.model_construct(
            id=r["id"],
            experiment_id=r["experiment_id"],
            experiment_name=r["experiment_name"],
            task_type=r["task_type"],
            template_id=r["template_id"],
            bundle_digest=r["bundle_digest"],
            submission=stored_submission(r["submission"]),
            request=stored_request(r["request"]),
            created_at=read_time_required(r["created_at"]),
            created_by=r["created_by"],
            replay_of=r["replay_of"],
            policy=stored_policy(r["policy"]),
            group_id=r["group_id"],
            attempts=tuple(attempts[r["id"]]),
        )
        for r in rows
    ]
