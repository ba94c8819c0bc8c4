"""The gate on run dependencies (`after:`), in the one launch path every placement takes
(Launching.launch: a submit, a retry, an automatic retry once due, a scheduler's placement).
A run whose dependencies have not all ended is held (prepared, out of the scheduler's queue, its
message naming what it waits for) and launched once they have; under `after.ok` one that ended
without success fails it (`dependency_failed`, never retried automatically). The end of a run
makes the runs held on it due (orbit.store.dependencies.wake_dependents): the server's
reconcile loop launches them; embedded, a look at a held run looks at what it waits for."""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from datetime import timedelta
from typing import TYPE_CHECKING

from orbit.core.control.base import ServicePart
from orbit.core.control.leases import launcher_id, now
from orbit.core.control.views import QueueEntry
from orbit.model.dependencies import After, Judgement, failed_message, judge, waiting_message
from orbit.model.errors import InvalidInput, NotFound, OrbitError
from orbit.model.models import FailureReason, RunState, RunStatus
from orbit.store.dependencies import Hold
from orbit.store.sql import read_time_required

if TYPE_CHECKING:
    from orbit.model.records import AttemptRecord, RunRecord

HELD_RECHECK_S = 300.0  # a held attempt is looked at again this often with nothing waking it
LOOK_UPSTREAM = 200  # runs not yet ended, upstream of a held run, that one look looks at
# set while a gate looks at what its run waits for (embedded): the gates of those runs then
# judge from the store, and the looking is done once, from the outermost gate, oldest first
# (a run is older than what waits for it), so a long chain of held runs advances in one look
# without one nested look per step
_looking: ContextVar[bool] = ContextVar("orbit_looking_at_dependencies", default=False)


class DependencyGate(ServicePart):
    def resolve_after(self, after: After | None, source: str) -> After | None:
        """The runs an `after:` names, as full ids; an unknown or ambiguous one is refused in
        one line naming the field (`spec.yaml: after.ok.0: unknown run 'run-0bad'`)."""
        if not after:
            return None
        found: dict[str, list[str]] = {"ok": [], "any": []}
        seen: dict[str, str] = {}
        for kind, index, ref in after.named():
            try:
                run_id = self.store.runs.resolve_run_id(ref)
            except (NotFound, InvalidInput) as exc:
                raise InvalidInput(f"{source}: after.{kind}.{index}: {exc}") from None
            if run_id in seen:
                raise InvalidInput(
                    f"{source}: after.{kind}.{index}: run {run_id} is named twice "
                    f"(also under after.{seen[run_id]})"
                )
            seen[run_id] = kind
            found[kind].append(run_id)
        return After(ok=tuple(found["ok"]), any=tuple(found["any"]))

    def held_back(self, run: RunRecord, attempt: AttemptRecord) -> bool:
        """Whether the gate keeps the attempt from launching now: held on dependencies still
        to end, failed for one that ended without success, or moved on meanwhile. False: its
        dependencies are met (or it has none), and the launch goes on."""
        if not run.submission.after:
            return False  # no query for the runs (most) that wait for nothing
        for _ in range(3):  # a dependency ending while it is held: judged again
            found = self._judge(run)
            if found.met:
                self.store.dependencies.release_hold(attempt.id)
                return False
            if found.failed is not None:
                self._fail(run, attempt, found)
                return True
            until = now() + timedelta(seconds=HELD_RECHECK_S)
            message = waiting_message(found.waiting)
            hold = self.store.dependencies.hold_attempt(
                attempt.id, run.id, launcher_id(), message, until
            )
            if hold is not Hold.ENDED:
                return True
        return True  # a busy pipeline: the next look judges it again

    def _judge(self, run: RunRecord) -> Judgement:
        """The run's dependencies as they stand; embedded, looked at where they run first."""
        needed = self.store.dependencies.of_run(run.id)
        if not self.config.looks_on_read or _looking.get() or all(d.ended for d in needed):
            return judge(needed)
        token = _looking.set(True)
        try:
            for upstream in self._upstream(run.id):
                with contextlib.suppress(OrbitError):  # as stored, then
                    self.parts.lifecycle.refresh_run_status(upstream.id)
        finally:
            _looking.reset(token)
        return judge(self.store.dependencies.of_run(run.id))

    def _upstream(self, run_id: str) -> list[RunRecord]:
        """The runs not yet ended that `run_id` waits for, directly or through others, oldest
        first: what waits is looked at after what it waits for."""
        found: dict[str, RunRecord] = {}
        frontier = [run_id]
        while frontier and len(found) < LOOK_UPSTREAM:
            for dep in self.store.dependencies.of_run(frontier.pop()):
                if not dep.ended and dep.run_id not in found:
                    found[dep.run_id] = self.store.runs.get_run(dep.run_id)
                    frontier.append(dep.run_id)
        return sorted(found.values(), key=lambda r: (r.created_at, r.id))

    def _fail(self, run: RunRecord, attempt: AttemptRecord, found: Judgement) -> None:
        assert found.failed is not None
        status = RunStatus(
            state=RunState.FAILED,
            reason=FailureReason.DEPENDENCY_FAILED,
            message=failed_message(found.failed),
        )
        self.parts.lifecycle.end(
            run.id, self.store.runs.get_attempt(attempt.id), status, actor="orbit"
        )

    def held_in_queue(self) -> list[QueueEntry]:
        """The runs held on their dependencies, for `orbit queue`: which runs each waits for,
        as those stand now."""
        rows = self.store.dependencies.held_attempts()
        needed = self.store.dependencies.of_runs([r["run_id"] for r in rows])
        at = now()
        out = []
        for row in rows:
            waiting = [d for d in needed[row["run_id"]] if not d.ended]
            said = ", ".join(f"{d.run_id} ({d.state}, after.{d.kind})" for d in waiting)
            created = read_time_required(row["created_at"])
            out.append(
                QueueEntry(
                    run=row["run_id"],
                    user=row["created_by"],
                    tier=row["request"].priority,
                    position=None,
                    outcome="held",
                    reason=f"waiting for its dependencies: {said or 'ending now'}",
                    waited_s=max(0.0, (at - created).total_seconds()),
                    waits_for=tuple(d.run_id for d in waiting),
                )
            )
        return out
