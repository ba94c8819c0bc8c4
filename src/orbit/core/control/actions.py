"""What people do to runs once they exist: cancel, retry (a new attempt of the same bundle)
and replay (a new run of the same bundle)."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

from orbit.core.control.base import ServicePart
from orbit.core.control.idempotency import Idempotency, made_by, made_meanwhile
from orbit.core.control.leases import lease_lapsed, now
from orbit.core.execution.leftovers import stop_leftovers
from orbit.model.errors import Refused, Unreachable
from orbit.model.models import (
    ATTEMPT_FIELDS,
    ExecutionOverrides,
    ExecutionRequest,
    FailureReason,
    RunState,
)
from orbit.model.records import RunRecord
from orbit.store.submit_keys import KeyTaken


class RunActions(ServicePart):
    def cancel_run(self, ref: str, wait_s: float | None = None) -> RunRecord:
        """Ask for a graceful stop; wait up to the grace period (plus a little) for it."""
        run, wait = self.ask_to_cancel(ref, wait_s)
        return (
            run
            if wait is None
            else self.parts.lifecycle.wait_for(run.id, timeout_s=wait, poll_s=0.2)
        )

    def ask_to_cancel(
        self, ref: str, wait_s: float | None = None
    ) -> tuple[RunRecord, float | None]:
        """Ask for a graceful stop, and say how long cancel_run waits for the run to end:
        `wait_s`, by default the run's stop grace and 5 s; None: it does not wait (the run has
        ended, or the stop reaches it later). `orbit server` waits without a thread."""
        run = self.parts.lifecycle.refresh_run_status(ref)
        attempt = run.current
        if attempt.state.terminal:
            with contextlib.suppress(Unreachable):
                self.stop_leftovers(run.id)
            return run, None
        self.store.attempts.request_cancel(attempt.id, self.actor)
        if attempt.handle is None:
            if not lease_lapsed(attempt, now()):
                # another process is launching it right now: it stops it once recorded
                return self.store.runs.get_run(run.id), None
            if not self.store.attempts.move_attempt(
                attempt.id,
                RunState.TERMINATED,
                actor=self.actor,
                reason=FailureReason.CANCELLED,
                expect=attempt.state,
            ):  # it moved meanwhile (launched, or ended): cancel it where it is now
                return self.ask_to_cancel(ref, wait_s)
            return self.store.runs.get_run(run.id), None
        try:
            self.execution.backend(attempt.backend_key).cancel(
                attempt.handle, FailureReason.CANCELLED
            )
        except Unreachable as exc:
            # kept as asked: delivered at the next contact, or the attempt ends when the host's
            # unreachable timeout does (and, cancelled, is not retried)
            self.store.attempts.record_contact(
                attempt.id,
                reachable=False,
                actor="orbit",
                message=f"cancel requested; it reaches the host when the host answers: {exc}",
            )
            return self.store.runs.get_run(run.id), None
        grace = run.request.stop_grace_s
        return run, grace + 5 if wait_s is None else wait_s

    def stop_leftovers(self, ref: str) -> int:
        """Stop the processes still running of a run's ended attempts (on a host that was given
        up on and came back, say); how many were stopped."""
        run = self.store.runs.get_run(ref)
        stopped = stop_leftovers(self.execution, run.attempts)
        for attempt_id, count in stopped.items():
            self.store.audit.record_event(
                self.actor,
                "run.leftovers_stopped",
                run_id=run.id,
                attempt_id=attempt_id,
                processes=count,
            )
        return sum(stopped.values())

    def _same_bundle_request(
        self, run: RunRecord, overrides: ExecutionOverrides, verb: str
    ) -> tuple[ExecutionRequest, dict[str, Any]]:
        """The run's request with attempt-level overrides (target, detach) laid over it, for a
        push of the same bundle. Anything else would change the bundle and is refused."""
        from orbit.model.overrides import check_whitelist, set_paths

        for path in set_paths(overrides):
            if path.split(".")[0] not in ATTEMPT_FIELDS:
                raise Refused(
                    f"override '{path}' would change the bundle; {verb} pushes the same bundle "
                    f"(it may change: {', '.join(sorted(ATTEMPT_FIELDS))}). "
                    "Submit a new run to change it"
                )
        changed = overrides.model_dump(exclude_unset=True)
        if changed:  # only then is the template needed: a retry works from any folder
            check_whitelist(self.templates.get(run.template_id), overrides)
        request = run.request.model_copy(update=changed)
        self.execution.backend(request.backend_key).validate(request)
        if changed.get("target"):  # a pool node that does not exist is named as such
            self.parts.scheduling.check_schedulable(request)
        self._bundle(run.bundle_digest)
        return request, changed

    def retry_run(self, ref: str, overrides: ExecutionOverrides | None = None) -> RunRecord:
        """A new attempt of the same bundle, of the same run."""
        run = self.parts.lifecycle.refresh_run_status(ref)
        if not run.state.terminal:
            raise Refused(f"run {run.id} is {run.state}: cancel it before retrying")
        if self.store.storage.marks(run.id).gone is not None:  # deleted, or expired
            raise Refused(
                f"run {run.id}'s artifacts were removed (deleted or expired): it is not retried; "
                "`orbit replay` makes a new run of its bundle while the bundle is kept"
            )
        request, changed = self._same_bundle_request(
            run, overrides or ExecutionOverrides(), "a retry"
        )
        self.parts.policy.readmit(run, request)  # made under an older version: today's too
        fenced = self._fenced_until(run)  # a lost attempt's node stops it first
        attempt = self.store.runs.add_attempt(
            run.id,
            target=request.target,
            backend_key=request.backend_key,
            trigger="retry",
            actor=self.actor,
            launcher=None if fenced else self.parts.lifecycle.claim(),
            not_before=fenced,
        )
        self.store.audit.record_event(
            self.actor, "run.retry", run_id=run.id, attempt_id=attempt.id, overrides=changed
        )
        if fenced is None:
            self.parts.launching.launch(
                self.store.runs.get_run(run.id), attempt, request, actor=self.actor
            )
        return self.store.runs.get_run(run.id)

    def _fenced_until(self, run: RunRecord) -> datetime | None:
        """Until when a retry of a run whose attempt was lost waits: its node, cut off, stops
        that attempt itself (orbit.agent.fencing), and the two must never run at once."""
        last = run.current
        if last.reason is not FailureReason.NODE_LOST or last.finished_at is None:
            return None
        wait = self.fence_wait_s(last)
        until = last.finished_at + timedelta(seconds=wait)
        return until if wait and until > datetime.now(UTC) else None

    def replay_run(
        self,
        ref: str,
        overrides: ExecutionOverrides | None = None,
        idempotency: Idempotency | None = None,
    ) -> RunRecord:
        """A new run of the same bundle, recording which run it replays. Unlike a retry it
        leaves the original run as it is, and works on runs in any state. With `idempotency`,
        a key this user sent before with the same request gets its run (see submit_staged)."""
        key = idempotency.of(self.actor) if idempotency else None
        earlier = made_by(self.store, key)
        if earlier is not None:
            return earlier
        original = self.store.runs.get_run(ref)
        request, changed = self._same_bundle_request(
            original, overrides or ExecutionOverrides(), "a replay"
        )
        stamp = self.parts.policy.readmit(original, request)
        try:
            run = self.store.runs.create_run(
                experiment_id=original.experiment_id,
                task_type=original.task_type,
                template_id=original.template_id,
                bundle_digest=original.bundle_digest,
                submission=original.submission,
                request=request,
                actor=self.actor,
                replay_of=original.id,
                launcher=self.parts.lifecycle.claim(),
                key=key,
                policy=stamp,
            )
        except KeyTaken:  # the same request, sent again while this one was at work
            assert key is not None
            return made_meanwhile(self.store, key)
        self.store.audit.record_event(
            self.actor, "run.replayed", run_id=run.id, replay_of=original.id, overrides=changed
        )
        self.parts.launching.launch(run, run.current, request, actor=self.actor)
        return self.store.runs.get_run(run.id)
