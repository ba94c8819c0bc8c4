"""Run dependencies in the store: the runs a run waits for (written with the run), how those
stand now, and the hold on an attempt whose dependencies have not ended. A held attempt is
left out of the scheduler's queue and looked at only when a run it waits for ends (the end
makes it due: `wake_dependents`, called by move_attempt in the ending's own transaction) or
after HELD_RECHECK_S as a safety net. Holding re-reads the dependencies under a lock on their
current attempts, so an end that commits meanwhile is never missed."""

from __future__ import annotations

from datetime import datetime
from enum import Enum

from orbit.model.dependencies import HELD, After, Needed
from orbit.model.models import FailureReason, RunState
from orbit.store.base import Part
from orbit.store.run_queries import with_request
from orbit.store.sql import Row, Tx, expand

# the current attempt of a run named `alias`.needs: its highest number, rank 0
_CURRENT = (
    "a.run_id = {alias}.needs AND a.rank = 0 AND a.number = "
    "(SELECT max(b.number) FROM attempts b WHERE b.run_id = {alias}.needs AND b.rank = 0)"
)
ACTIVE = [s.value for s in RunState if not s.terminal]


class Hold(Enum):
    HELD = "held"  # held: it waits for its dependencies
    ENDED = "ended"  # its dependencies ended meanwhile: judge again
    GONE = "gone"  # the attempt moved on (cancelled, or another process is launching it)


def write_dependencies(tx: Tx, run_id: str, after: After | None) -> None:
    """The runs a new run waits for (its submission's `after`, already resolved to ids)."""
    position = 0
    for kind in ("ok", "any"):
        for needs in getattr(after, kind) if after else ():
            tx.execute(
                "INSERT INTO run_dependencies (run_id, needs, kind, position) "
                "VALUES (:run, :needs, :kind, :pos)",
                {"run": run_id, "needs": needs, "kind": kind, "pos": position},
            )
            position += 1


def wake_dependents(tx: Tx, run_id: str, at: datetime) -> None:
    """`run_id` has ended: the held attempts of the runs waiting for it are due now."""
    tx.execute(
        "UPDATE attempts SET not_before = :at, reconcile_due_at = :at "
        "WHERE held IS NOT NULL AND state = :prepared AND run_id IN "
        "(SELECT run_id FROM run_dependencies WHERE needs = :run)",
        {"at": at, "prepared": RunState.PREPARED.value, "run": run_id},
    )


def _needed(rows: list[Row]) -> list[Needed]:
    return [
        Needed(
            run_id=r["needs"],
            kind=r["kind"],
            state=RunState(r["state"]),
            reason=FailureReason(r["reason"]) if r["reason"] else None,
        )
        for r in rows
    ]


class Dependencies(Part):
    def of_run(self, run_id: str) -> list[Needed]:
        """The runs `run_id` waits for, as each stands now, in the order written."""
        with self._read() as tx:
            return _needed(
                tx.all(
                    "SELECT d.needs, d.kind, a.state, a.reason FROM run_dependencies d "
                    f"JOIN attempts a ON {_CURRENT.format(alias='d')} "
                    "WHERE d.run_id = :run ORDER BY d.position",
                    {"run": run_id},
                )
            )

    def hold_attempt(
        self, attempt_id: str, run_id: str, owner: str, message: str, until: datetime
    ) -> Hold:
        """Hold a prepared, unlaunched attempt back on its dependencies: out of the queue, its
        claim (`owner`'s, if any) given up, `message` saying what it waits for, looked at again
        at `until` at the latest. Only while a dependency has still not ended, read under a
        lock on the dependencies' current attempts: an end committing meanwhile either is seen
        here (ENDED) or comes after the hold and wakes it."""
        lock = " FOR UPDATE OF a" if self.dialect == "postgresql" else ""
        with self._write() as tx:
            rows = tx.all(
                f"SELECT a.state FROM run_dependencies d JOIN attempts a ON "
                f"{_CURRENT.format(alias='d')} WHERE d.run_id = :run{lock}",
                {"run": run_id},
            )
            if all(RunState(r["state"]).terminal for r in rows):
                return Hold.ENDED
            changed = tx.execute(
                "UPDATE attempts SET held = :held, message = :message, not_before = :until, "
                "reconcile_due_at = :until, lease_owner = NULL, lease_expires_at = NULL "
                "WHERE id = :id AND state = :prepared AND handle IS NULL AND node_id IS NULL "
                "AND (lease_owner IS NULL OR lease_owner = :owner)",
                {
                    "held": HELD,
                    "message": message,
                    "until": until,
                    "id": attempt_id,
                    "prepared": RunState.PREPARED.value,
                    "owner": owner,
                },
            )
        return Hold.HELD if changed == 1 else Hold.GONE

    def release_hold(self, attempt_id: str) -> None:
        """Its dependencies are met: back into the queue (a pool run) now, no longer held."""
        with self._write() as tx:
            tx.execute(
                "UPDATE attempts SET held = NULL, message = NULL, not_before = NULL "
                "WHERE id = :id AND held IS NOT NULL AND state = :prepared",
                {"id": attempt_id, "prepared": RunState.PREPARED.value},
            )

    def held_attempts(self) -> list[Row]:
        """Every held attempt with its run's request and submission, oldest first."""
        with self._read() as tx:
            return with_request(
                tx.all(
                    "SELECT a.id, a.run_id, a.created_at, r.request, r.created_by "
                    "FROM attempts a JOIN runs r ON r.id = a.run_id "
                    "WHERE a.held IS NOT NULL AND a.state = :prepared ORDER BY a.created_at, a.id",
                    {"prepared": RunState.PREPARED.value},
                )
            )

    def of_runs(self, run_ids: list[str]) -> dict[str, list[Needed]]:
        """of_run() of several runs in one read."""
        out: dict[str, list[Needed]] = {r: [] for r in run_ids}
        if not run_ids:
            return out
        with self._read() as tx:
            for start in range(0, len(run_ids), 500):
                marks, params = expand("r", run_ids[start : start + 500])
                rows = tx.all(
                    "SELECT d.run_id, d.needs, d.kind, a.state, a.reason FROM run_dependencies d "
                    f"JOIN attempts a ON {_CURRENT.format(alias='d')} "
                    f"WHERE d.run_id IN ({marks}) ORDER BY d.run_id, d.position",
                    params,
                )
                for row, needed in zip(rows, _needed(rows), strict=True):
                    out[row["run_id"]].append(needed)
        return out
