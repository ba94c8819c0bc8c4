"""How an attempt's state changes in the store: `move_attempt`, the one place a state changes
(with the retry a move to an end opens), the launch recorded (its handle and the move to
submitted in one compare-and-set), and what is written of an attempt without a move: the
execution plane's notes, whether its host answers, a cancel asked for."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orbit.model.errors import NotFound
from orbit.model.models import FailureReason, RunHandle, RunState
from orbit.model.states import check_move
from orbit.store.attempt_leases import Lease, set_launch_claim, wake_waiting_for_nodes
from orbit.store.audit import append_event
from orbit.store.base import Part, utcnow
from orbit.store.dependencies import wake_dependents
from orbit.store.run_queries import stored_request
from orbit.store.sql import Row, Tx

ACTIVE_IN = "(" + ", ".join(f"'{s.value}'" for s in RunState if not s.terminal) + ")"


def mirror(tx: Tx, run_id: str, state: RunState) -> None:
    """The run's copy of its current attempt's state (runs.state: a listing by state is one
    index range), written in each transaction that moves or opens that attempt."""
    tx.execute(
        "UPDATE runs SET state = :state WHERE id = :id", {"state": state.value, "id": run_id}
    )


def insert_attempt(
    tx: Tx,
    run_id: str,
    number: int,
    target: str | None,
    backend_key: str,
    trigger: str,
    actor: str,
) -> str:
    """Write attempt `number` of the run, prepared, in the caller's transaction (the run's
    current attempt from now on: its state is the run's); its id."""
    now = utcnow()
    attempt_id = f"{run_id}-{number}"
    tx.execute(
        'INSERT INTO attempts (id, run_id, number, state, target, backend_key, "trigger", '
        "cancel_requested, created_at, updated_at) VALUES (:id, :run_id, :number, :state, "
        ":target, :backend_key, :trigger, :cancel, :now, :now)",
        {
            "id": attempt_id,
            "run_id": run_id,
            "number": number,
            "state": RunState.PREPARED.value,
            "target": target,
            "backend_key": backend_key,
            "trigger": trigger,
            "cancel": False,
            "now": now,
        },
    )
    mirror(tx, run_id, RunState.PREPARED)
    append_event(
        tx,
        actor,
        "attempt.created",
        run_id=run_id,
        attempt_id=attempt_id,
        number=number,
        target=target,
        trigger=trigger,
    )
    return attempt_id


@dataclass(frozen=True)
class AutoRetry:
    """An automatic retry, opened by `move_attempt` in the transaction that ends the attempt
    before it: the next attempt of the same bundle, on the same target, launchable after
    `not_before` (its backoff) or claimed at once by `launcher`. `event` is the data of its
    `run.auto_retry` event."""

    event: dict[str, Any] = field(default_factory=dict)
    not_before: datetime | None = None
    launcher: Lease | None = None
    actor: str = "orbit"


class AttemptStates(Part):
    def move_attempt(
        self,
        attempt_id: str,
        to: RunState,
        *,
        actor: str,
        reason: FailureReason | None = None,
        expect: RunState | None = None,
        exit_code: int | None = None,
        message: str | None = None,
        started_at: datetime | None = None,
        finished_at: datetime | None = None,
        retry: AutoRetry | None = None,
    ) -> bool:
        """The one function that changes a state. It checks the move against the table,
        compares-and-sets the row (so two processes never both make the same move), and writes
        the event in the same transaction. Returns False when the attempt is already there
        (or, with `expect`, no longer where the caller saw it).

        With `retry`, a move to an end also opens the next attempt in the same transaction
        (unless a cancel was asked for meanwhile), so that no reader ever sees the run ended
        while its retry is still to come, and a process that dies right after the end cannot
        lose the retry its policy owed."""
        with self._write() as tx:
            row = tx.one(
                "SELECT run_id, state, number, rank, target, backend_key, cancel_requested, "
                "node_id FROM attempts WHERE id = :id",
                {"id": attempt_id},
            )
            if row is None:
                raise NotFound(f"unknown attempt '{attempt_id}'")
            current = RunState(row["state"])
            if current == to or (expect is not None and current != expect):
                return False
            check_move(current, to, reason)
            now = utcnow()
            values: dict[str, Any] = {
                "state": to.value,
                "updated_at": now,
                "reason": reason.value if reason is not None else None,
            }
            if exit_code is not None:
                values["exit_code"] = exit_code
            if message is not None:
                values["message"] = message
            if started_at is not None:
                values["started_at"] = started_at
            if to.terminal:
                values["finished_at"] = finished_at or now
                values["held"] = None
            assignments = ", ".join(f"{column} = :{column}" for column in values)
            changed = tx.execute(
                f"UPDATE attempts SET {assignments} WHERE id = :id AND state = :seen",
                {**values, "id": attempt_id, "seen": current.value},
            )
            if changed != 1:  # another process moved it first: nothing was written here
                return False
            if row["rank"] == 0:  # a gang's member (rank > 0) follows its leader, not the run
                mirror(tx, row["run_id"], to)
            data: dict[str, Any] = {"from": current.value, "to": to.value}
            if reason is not None:
                data["reason"] = reason.value
            if exit_code is not None:
                data["exit_code"] = exit_code
            if message:
                data["message"] = message
            append_event(
                tx, actor, "attempt.state", run_id=row["run_id"], attempt_id=attempt_id, **data
            )
            if to.terminal:
                # a gang's members end with it: their nodes' slots free, and an agent still
                # running one is told to stop at its next report or sync
                tx.execute(
                    f"UPDATE attempts SET {assignments} WHERE gang_of = :id AND state IN "
                    f"{ACTIVE_IN}",
                    {**values, "id": attempt_id},
                )
            if retry is not None and to.terminal and not row["cancel_requested"]:
                self._open_retry(tx, row, attempt_id, retry)
            elif to.terminal:  # the run has ended: the runs waiting for it are due a look
                wake_dependents(tx, row["run_id"], now)
            if to.terminal and row["node_id"] is not None:
                wake_waiting_for_nodes(tx, now)  # its node has room again
        return True

    def _open_retry(self, tx: Tx, ended: Row, attempt_id: str, retry: AutoRetry) -> None:
        """The next attempt after `ended` (the run's last: it had not ended until now)."""
        run_id = ended["run_id"]
        append_event(
            tx, retry.actor, "run.auto_retry", run_id=run_id, attempt_id=attempt_id, **retry.event
        )
        target, backend_key = ended["target"], ended["backend_key"]
        if not backend_key.startswith("agent_pool"):
            # one that overflowed from its pool onto an SSH host is retried as its run asks
            # (the scheduler may place it in the pool, or on another host), not on that host
            raw = tx.scalar("SELECT request FROM runs WHERE id = :r", {"r": run_id})
            request = stored_request(raw)
            if request.placement.kind == "agent_pool":
                target, backend_key = request.target, request.backend_key
        new_id = insert_attempt(
            tx,
            run_id,
            ended["number"] + 1,
            target,
            backend_key,
            "auto_retry",
            retry.actor,
        )
        set_launch_claim(tx, new_id, launcher=retry.launcher, not_before=retry.not_before)

    def record_launch(self, attempt_id: str, handle: RunHandle, *, actor: str, **data: Any) -> bool:
        """The attempt was launched: its handle and the move prepared -> submitted, with both
        events, in one compare-and-set. False when the attempt had already left prepared (a
        reconciler judged it meanwhile): the handle is then not recorded."""
        check_move(RunState.PREPARED, RunState.SUBMITTED, None)
        now = utcnow()
        with self._write() as tx:
            row = tx.one("SELECT run_id, rank FROM attempts WHERE id = :id", {"id": attempt_id})
            if row is None:
                raise NotFound(f"unknown attempt '{attempt_id}'")
            run_id = row["run_id"]
            changed = tx.execute(
                "UPDATE attempts SET state = :submitted, handle = :handle, updated_at = :now, "
                "last_contact_at = :now, unreachable_since = NULL, reason = NULL, "
                "message = NULL, lease_owner = NULL, lease_expires_at = NULL, not_before = NULL "
                "WHERE id = :id AND state = :prepared",
                {
                    "submitted": RunState.SUBMITTED.value,
                    "handle": handle.model_dump(mode="json"),
                    "now": now,
                    "id": attempt_id,
                    "prepared": RunState.PREPARED.value,
                },
            )
            if changed != 1:
                return False
            if row["rank"] == 0:
                mirror(tx, run_id, RunState.SUBMITTED)
            ids = {"run_id": run_id, "attempt_id": attempt_id}
            moved = {"from": RunState.PREPARED.value, "to": RunState.SUBMITTED.value}
            append_event(tx, actor, "attempt.state", **ids, **moved)
            append_event(
                tx,
                actor,
                "run.submitted",
                **ids,
                backend=handle.backend_key,
                target=handle.target,
                location=handle.location,
                **data,
            )
        return True

    def note_attempt(self, attempt_id: str, state: RunState, message: str) -> bool:
        """What the execution plane says now of an attempt that stays in `state` (Slurm's
        pending reason and estimated start, say). Not a state change and not audited; written
        only while the attempt is in `state` and not marked unreachable."""
        with self._write() as tx:
            changed = tx.execute(
                "UPDATE attempts SET message = :message WHERE id = :id AND state = :state "
                "AND unreachable_since IS NULL",
                {"message": message, "id": attempt_id, "state": state.value},
            )
        return changed == 1

    def record_contact(
        self, attempt_id: str, *, reachable: bool, actor: str, message: str | None = None
    ) -> None:
        """Whether the attempt's host answered just now. Not a state change: an unreachable
        host's attempt keeps its state, with reason host_unreachable and the time of the last
        contact, until it answers again or the service gives up on it. Only the first miss and
        the first contact after one are audited."""
        now = utcnow()
        with self._write() as tx:
            row = tx.one(
                "SELECT run_id, state, unreachable_since FROM attempts WHERE id = :id",
                {"id": attempt_id},
            )
            if row is None:
                raise NotFound(f"unknown attempt '{attempt_id}'")
            if RunState(row["state"]).terminal:
                return
            was_unreachable = row["unreachable_since"] is not None
            if reachable:
                sets = "last_contact_at = :now, unreachable_since = NULL"
                if was_unreachable:
                    sets += ", reason = NULL, message = NULL"
            else:
                sets = "reason = :reason, message = :message"
                if not was_unreachable:
                    sets += ", unreachable_since = :now"
            # only while it is in the state read above: an ending keeps its own reason
            changed = tx.execute(
                f"UPDATE attempts SET {sets} WHERE id = :id AND state = :state",
                {
                    "now": now,
                    "reason": FailureReason.HOST_UNREACHABLE.value,
                    "message": message,
                    "id": attempt_id,
                    "state": row["state"],
                },
            )
            if changed != 1:
                return
            ids = {"run_id": row["run_id"], "attempt_id": attempt_id}
            if reachable and was_unreachable:
                append_event(tx, actor, "host.reachable", **ids)
            elif not reachable and not was_unreachable:
                append_event(tx, actor, "host.unreachable", **ids, message=message)

    def request_cancel(self, attempt_id: str, actor: str) -> None:
        with self._write() as tx:
            run_id = tx.scalar("SELECT run_id FROM attempts WHERE id = :id", {"id": attempt_id})
            if run_id is None:
                raise NotFound(f"unknown attempt '{attempt_id}'")
            tx.execute(
                "UPDATE attempts SET cancel_requested = :yes WHERE id = :id",
                {"yes": True, "id": attempt_id},
            )
            append_event(tx, actor, "run.cancel_requested", run_id=run_id, attempt_id=attempt_id)
