"""What people do to runs once they exist: cancel, retry (a new attempt of the same bundle)
and replay (a new run of the same bundle)."""

from __future__ import annotations

import contextlib
from typing import Any

from orbit.core.control.lifecycle import lease_lapsed, now
from orbit.core.control.submit import Submitting
from orbit.core.errors import Refused, Unreachable
from orbit.core.execution.leftovers import stop_leftovers
from orbit.core.models import (
    ATTEMPT_FIELDS,
    ExecutionOverrides,
    ExecutionRequest,
    FailureReason,
    RunState,
)
from orbit.core.records import RunRecord


class RunActions(Submitting):
    def cancel_run(self, ref: str, wait_s: float | None = None) -> RunRecord:
        """Ask for a graceful stop; wait up to the grace period (plus a little) for it."""
        run = self.refresh_run_status(ref)
        attempt = run.current
        if attempt.state.terminal:
            with contextlib.suppress(Unreachable):
                self.stop_leftovers(run.id)
            return run
        self.store.request_cancel(attempt.id, self.actor)
        if attempt.handle is None:
            if not lease_lapsed(attempt, now()):
                # another process is launching it right now: it stops it once recorded
                return self.store.get_run(run.id)
            if not self.store.move_attempt(
                attempt.id,
                RunState.TERMINATED,
                actor=self.actor,
                reason=FailureReason.CANCELLED,
                expect=attempt.state,
            ):  # it moved meanwhile (launched, or ended): cancel it where it is now
                return self.cancel_run(ref, wait_s)
            return self.store.get_run(run.id)
        try:
            self.execution.backend(attempt.backend_key).cancel(
                attempt.handle, FailureReason.CANCELLED
            )
        except Unreachable as exc:
            # kept as asked: delivered at the next contact, or the attempt ends when the host's
            # unreachable timeout does (and, cancelled, is not retried)
            self.store.record_contact(
                attempt.id,
                reachable=False,
                actor="orbit",
                message=f"cancel requested; it reaches the host when the host answers: {exc}",
            )
            return self.store.get_run(run.id)
        grace = float(run.request.get("stop_grace_s", 10.0))
        return self.wait_for(run.id, timeout_s=grace + 5 if wait_s is None else wait_s, poll_s=0.2)

    def stop_leftovers(self, ref: str) -> int:
        """Stop the processes still running of a run's ended attempts (on a host that was given
        up on and came back, say); how many were stopped."""
        run = self.store.get_run(ref)
        stopped = stop_leftovers(self.execution, run.attempts)
        for attempt_id, count in stopped.items():
            self.store.record_event(
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
        from orbit.core.overrides import check_whitelist, set_paths

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
        request = ExecutionRequest.model_validate(run.request).model_copy(update=changed)
        self.execution.backend(request.backend_key).validate(request)
        self._bundle(run.bundle_digest)
        return request, changed

    def retry_run(self, ref: str, overrides: ExecutionOverrides | None = None) -> RunRecord:
        """A new attempt of the same bundle, of the same run."""
        run = self.refresh_run_status(ref)
        if not run.state.terminal:
            raise Refused(f"run {run.id} is {run.state}: cancel it before retrying")
        request, changed = self._same_bundle_request(
            run, overrides or ExecutionOverrides(), "a retry"
        )
        attempt = self.store.add_attempt(
            run.id,
            target=request.target,
            backend_key=request.backend_key,
            trigger="retry",
            actor=self.actor,
            launcher=self._claim(),
        )
        self.store.record_event(
            self.actor, "run.retry", run_id=run.id, attempt_id=attempt.id, overrides=changed
        )
        self._launch(self.store.get_run(run.id), attempt, request, actor=self.actor)
        return self.store.get_run(run.id)

    def replay_run(self, ref: str, overrides: ExecutionOverrides | None = None) -> RunRecord:
        """A new run of the same bundle, recording which run it replays. Unlike a retry it
        leaves the original run as it is, and works on runs in any state."""
        original = self.store.get_run(ref)
        request, changed = self._same_bundle_request(
            original, overrides or ExecutionOverrides(), "a replay"
        )
        run = self.store.create_run(
            experiment_id=original.experiment_id,
            task_type=original.task_type,
            template_id=original.template_id,
            bundle_digest=original.bundle_digest,
            submission=original.submission,
            request=request.model_dump(mode="json"),
            target=request.target,
            backend_key=request.backend_key,
            actor=self.actor,
            replay_of=original.id,
            launcher=self._claim(),
        )
        self.store.record_event(
            self.actor, "run.replayed", run_id=run.id, replay_of=original.id, overrides=changed
        )
        self._launch(run, run.current, request, actor=self.actor)
        return self.store.get_run(run.id)
