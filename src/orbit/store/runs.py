"""Runs and their attempts in the store, and `move_attempt`: the one place a state changes."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orbit.core.errors import InvalidInput, NotFound
from orbit.core.models import FailureReason, RunHandle, RunState
from orbit.core.records import AttemptRecord, RunRecord
from orbit.core.states import check_move
from orbit.store import base
from orbit.store.audit import append_event
from orbit.store.base import utcnow
from orbit.store.run_queries import RunQueriesMixin
from orbit.store.sql import Conflict, Row, Tx, expand, read_json

ACTIVE_IN = "(" + ", ".join(f"'{s.value}'" for s in RunState if not s.terminal) + ")"

# who claims an attempt for launching, and until when the claim holds without a renewal
Lease = tuple[str, datetime]


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


def wake_waiting_for_nodes(
    tx: Tx, at: datetime, count: int = 1, after: datetime | None = None
) -> None:
    """Make the oldest attempts waiting for a free node due now (they wait NODE_WAIT_S
    between tries otherwise): a freed slot is taken within a reconcile pass, first come first
    served, without every waiting attempt asking again and again."""
    tx.execute(
        "UPDATE attempts SET not_before = :at, reconcile_due_at = :at "
        "WHERE id IN (SELECT id FROM attempts "
        "WHERE state = :prepared AND handle IS NULL AND lease_owner IS NULL "
        "AND backend_key LIKE 'agent_pool%' AND not_before > :at "
        + ("AND created_at > :after " if after is not None else "")
        + "ORDER BY created_at LIMIT :n)",
        {"at": at, "prepared": RunState.PREPARED.value, "n": count, "after": after},
    )


class RunsMixin(RunQueriesMixin):
    def create_run(
        self,
        *,
        experiment_id: str,
        task_type: str,
        template_id: str,
        bundle_digest: str,
        submission: dict[str, Any],
        request: dict[str, Any],
        target: str | None,
        backend_key: str,
        actor: str,
        replay_of: str | None = None,
        launcher: Lease | None = None,
    ) -> RunRecord:
        """A new run with its first attempt, in state prepared; with `launcher`, claimed for
        launching by it in the same transaction (no other process can launch it first)."""
        run_id = base.new_id("run")
        with self._write() as tx:
            tx.execute(
                "INSERT INTO runs (id, experiment_id, task_type, template_id, bundle_digest, "
                "submission, request, created_at, created_by, replay_of) VALUES (:id, "
                ":experiment_id, :task_type, :template_id, :bundle_digest, :submission, "
                ":request, :created_at, :created_by, :replay_of)",
                {
                    "id": run_id,
                    "experiment_id": experiment_id,
                    "task_type": task_type,
                    "template_id": template_id,
                    "bundle_digest": bundle_digest,
                    "submission": submission,
                    "request": request,
                    "created_at": utcnow(),
                    "created_by": actor,
                    "replay_of": replay_of,
                },
            )
            append_event(
                tx,
                actor,
                "run.created",
                run_id=run_id,
                bundle_digest=bundle_digest,
                template_id=template_id,
                task_type=task_type,
            )
            attempt_id = self._add_attempt(tx, run_id, 1, target, backend_key, "submit", actor)
            self._claimed(tx, attempt_id, launcher=launcher, not_before=None)
        return self.get_run(run_id)

    @staticmethod
    def _add_attempt(
        tx: Tx,
        run_id: str,
        number: int,
        target: str | None,
        backend_key: str,
        trigger: str,
        actor: str,
    ) -> str:
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
                attempt_id = self._add_attempt(
                    tx, run_id, number, target, backend_key, trigger, actor
                )
                self._claimed(tx, attempt_id, launcher=launcher, not_before=not_before)
        except Conflict:  # another process added attempt `number` first
            raise InvalidInput(
                f"run {run_id} already has a new attempt {number}: another retry was first"
            ) from None
        return self.get_attempt(attempt_id)

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
                "SELECT run_id, state, number, target, backend_key, cancel_requested, node_id "
                "FROM attempts WHERE id = :id",
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
            assignments = ", ".join(f"{column} = :{column}" for column in values)
            changed = tx.execute(
                f"UPDATE attempts SET {assignments} WHERE id = :id AND state = :seen",
                {**values, "id": attempt_id, "seen": current.value},
            )
            if changed != 1:  # another process moved it first: nothing was written here
                return False
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
            request = read_json(tx.scalar("SELECT request FROM runs WHERE id = :r", {"r": run_id}))
            kinds = (request or {}).get("placement", {}), (request or {}).get("launch_mode", {})
            if kinds[0].get("kind") == "agent_pool":
                target = (request or {}).get("target")
                backend_key = f"agent_pool_{kinds[1].get('kind')}"
        new_id = self._add_attempt(
            tx,
            run_id,
            ended["number"] + 1,
            target,
            backend_key,
            "auto_retry",
            retry.actor,
        )
        self._claimed(tx, new_id, launcher=retry.launcher, not_before=retry.not_before)

    @staticmethod
    def _claimed(
        tx: Tx, attempt_id: str, *, launcher: Lease | None, not_before: datetime | None
    ) -> None:
        if launcher is None and not_before is None:
            return
        owner, until = launcher if launcher is not None else (None, None)
        tx.execute(
            "UPDATE attempts SET lease_owner = :owner, lease_expires_at = :until, "
            "not_before = :at WHERE id = :id",
            {"owner": owner, "until": until, "at": not_before, "id": attempt_id},
        )

    def claim_launch(
        self, attempt_id: str, owner: str, until: datetime, *, expect: str | None
    ) -> bool:
        """Claim a prepared, unlaunched attempt for launching, if its claim is still `expect`'s
        (None: unclaimed). Compare-and-set: of two processes, one wins."""
        held = "lease_owner IS NULL" if expect is None else "lease_owner = :expect"
        with self._write() as tx:
            changed = tx.execute(
                "UPDATE attempts SET lease_owner = :owner, lease_expires_at = :until "
                f"WHERE id = :id AND state = :prepared AND handle IS NULL AND {held}",
                {
                    "owner": owner,
                    "until": until,
                    "id": attempt_id,
                    "prepared": RunState.PREPARED.value,
                    "expect": expect,
                },
            )
        return changed == 1

    def renew_launch(self, attempt_id: str, owner: str, until: datetime) -> bool:
        with self._write() as tx:
            changed = tx.execute(
                "UPDATE attempts SET lease_expires_at = :until "
                "WHERE id = :id AND state = :prepared AND lease_owner = :owner",
                {
                    "until": until,
                    "id": attempt_id,
                    "prepared": RunState.PREPARED.value,
                    "owner": owner,
                },
            )
        return changed == 1

    def defer_launch(
        self, attempt_id: str, owner: str, not_before: datetime, message: str | None = None
    ) -> None:
        """Give up `owner`'s launch claim; the attempt is due again at `not_before`. `message`
        says what it waits for (a free node), shown with the run."""
        sets = ", message = :message" if message is not None else ""
        with self._write() as tx:
            tx.execute(
                "UPDATE attempts SET lease_owner = NULL, lease_expires_at = NULL, "
                f"not_before = :at, reconcile_due_at = :at{sets} WHERE id = :id "
                "AND state = :prepared AND lease_owner = :owner",
                {
                    "message": message,
                    "at": not_before,
                    "id": attempt_id,
                    "prepared": RunState.PREPARED.value,
                    "owner": owner,
                },
            )

    def record_launch(self, attempt_id: str, handle: RunHandle, *, actor: str, **data: Any) -> bool:
        """The attempt was launched: its handle and the move prepared -> submitted, with both
        events, in one compare-and-set. False when the attempt had already left prepared (a
        reconciler judged it meanwhile): the handle is then not recorded."""
        check_move(RunState.PREPARED, RunState.SUBMITTED, None)
        now = utcnow()
        with self._write() as tx:
            run_id = tx.scalar("SELECT run_id FROM attempts WHERE id = :id", {"id": attempt_id})
            if run_id is None:
                raise NotFound(f"unknown attempt '{attempt_id}'")
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

    def claim_reconcile(
        self, owner: str, *, at: datetime, lease_until: datetime, limit: int
    ) -> list[tuple[str, str]]:
        """Up to `limit` attempts that have not ended and are due a reconcile at `at` (never
        looked at first, then the longest due), leased to `owner` until `lease_until`:
        [(run_id, attempt_id)]. Each server replica's reconcile loop claims its share, so no
        two look at one attempt at once: SQLite's writers take turns, and on PostgreSQL rows
        another replica is claiming are skipped (FOR UPDATE SKIP LOCKED), not waited for."""
        if limit <= 0:
            return []
        placeholders, states = expand("state", [s.value for s in RunState if not s.terminal])
        lock = " FOR UPDATE SKIP LOCKED" if self.dialect == "postgresql" else ""
        with self._write() as tx:
            rows = tx.all(
                # a gang's members are looked at through their leader
                f"SELECT id, run_id FROM attempts WHERE state IN ({placeholders}) "
                "AND gang_of IS NULL AND (reconcile_due_at IS NULL OR reconcile_due_at <= :at) "
                f"ORDER BY reconcile_due_at IS NOT NULL, reconcile_due_at, id LIMIT :limit{lock}",
                {**states, "at": at, "limit": limit},
            )
            if rows:
                ids, params = expand("id", [r["id"] for r in rows])
                tx.execute(
                    "UPDATE attempts SET reconcile_owner = :owner, reconcile_due_at = :until "
                    f"WHERE id IN ({ids})",
                    {**params, "owner": owner, "until": lease_until},
                )
        return [(r["run_id"], r["id"]) for r in rows]

    def reconcile_done(self, attempt_id: str, owner: str, next_due: datetime) -> None:
        """`owner` has looked at the attempt: it is due again at `next_due`, or, a prepared
        attempt waiting (a backoff, a free node), when its wait is over. A lease another
        replica has taken over meanwhile (this one's ran out) is left to it."""
        with self._write() as tx:
            tx.execute(
                "UPDATE attempts SET reconcile_due_at = CASE WHEN state = :prepared AND "
                "lease_owner IS NULL AND not_before > :due THEN not_before ELSE :due END "
                "WHERE id = :id AND reconcile_owner = :owner",
                {
                    "due": next_due,
                    "id": attempt_id,
                    "owner": owner,
                    "prepared": RunState.PREPARED.value,
                },
            )

    def make_due(self, attempt_ids: list[str], at: datetime, unless_after: datetime) -> int:
        """These attempts are due a reconcile at `at`: their execution plane has news (an
        agent reported them ended). One whose look is under way (due at its lease's end,
        past `unless_after`) is left alone: no second look at once. How many."""
        if not attempt_ids:
            return 0
        ids, params = expand("id", attempt_ids)
        with self._write() as tx:
            return tx.execute(
                # a gang member's news is its leader's (members are looked at through it)
                f"UPDATE attempts SET reconcile_due_at = :at WHERE (id IN ({ids}) OR id IN "
                f"(SELECT gang_of FROM attempts WHERE id IN ({ids}))) AND gang_of IS NULL "
                "AND (reconcile_due_at IS NULL OR reconcile_due_at <= :unless_after)",
                {**params, "at": at, "unless_after": unless_after},
            )

    def reconcile_holders(self, at: datetime) -> list[str]:
        """Who holds the reconcile leases of active attempts not due at `at`: a replica with a
        look under way, or the one whose last look scheduled the next."""
        placeholders, states = expand("state", [s.value for s in RunState if not s.terminal])
        with self._read() as tx:
            rows = tx.all(
                "SELECT DISTINCT reconcile_owner FROM attempts "
                f"WHERE state IN ({placeholders}) AND reconcile_due_at > :at "
                "AND reconcile_owner IS NOT NULL",
                {**states, "at": at},
            )
        return sorted(str(r["reconcile_owner"]) for r in rows)

    def release_reconcile(self, owner: str, at: datetime) -> int:
        """`owner` is known gone (killed mid-look, say): the active attempts it holds are due
        at `at`, instead of when its leases would have run out. How many."""
        placeholders, states = expand("state", [s.value for s in RunState if not s.terminal])
        with self._write() as tx:
            return tx.execute(
                "UPDATE attempts SET reconcile_due_at = :at "
                f"WHERE reconcile_owner = :owner AND state IN ({placeholders}) "
                "AND reconcile_due_at > :at",
                {**states, "owner": owner, "at": at},
            )
