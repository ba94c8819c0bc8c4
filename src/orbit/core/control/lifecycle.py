"""An attempt's life as the control plane drives it: launch, look at it where it runs, end it,
and let the retry policy start the next one. Embedded, this runs whenever a command looks at a
run; the server's loops will call the same methods with nobody looking."""

from __future__ import annotations

import contextlib
import time
from datetime import UTC, datetime
from typing import Any

from orbit.core.control.base import ServiceBase
from orbit.core.errors import NoBackend, OrbitError, Unreachable
from orbit.core.execution.backends.base import AttemptContext, LaunchError
from orbit.core.models import ExecutionRequest, FailureReason, RetryPolicy, RunState, RunStatus
from orbit.core.records import AttemptRecord, RunRecord
from orbit.core.retry import should_retry
from orbit.core.states import ALLOWED


def _contact_is_old(attempt: AttemptRecord, every_s: float = 1.0) -> bool:
    """Whether the last recorded contact is old enough to be worth a write."""
    last = attempt.last_contact_at
    return last is None or (datetime.now(UTC) - last).total_seconds() >= every_s


class Lifecycle(ServiceBase):
    def _launch(self, run: RunRecord, attempt: AttemptRecord, request: ExecutionRequest) -> None:
        """Stage and start one attempt, then record its handle and the move to submitted in
        one compare-and-set; a launch that failed ends the attempt (and may retry it)."""
        backend = self.execution.backend(request.backend_key)
        context = AttemptContext(run_id=run.id, attempt_id=attempt.id)
        try:
            try:
                bundle = self._bundle(run.bundle_digest)
            except OrbitError as exc:
                raise LaunchError(FailureReason.STAGING_FAILED, str(exc)) from None
            try:
                handle = backend.launch(bundle, request, context)
            except (OrbitError, OSError) as exc:  # a backend's refusal or missing tool
                raise LaunchError(FailureReason.LAUNCH_FAILED, str(exc)) from exc
        except LaunchError as exc:
            self._end(
                run.id,
                attempt,
                RunStatus(state=RunState.FAILED, reason=exc.reason, message=str(exc)),
                actor=self.actor,
            )
            return
        extra: dict[str, Any] = {
            k: handle.data[k] for k in ("staged_bytes", "bundle_cached") if k in handle.data
        }
        self.store.record_launch(attempt.id, handle, actor=self.actor, **extra)

    def _end(self, run_id: str, attempt: AttemptRecord, status: RunStatus, actor: str) -> None:
        """Move the attempt to where its status says (compare-and-set on the state it had) and,
        when that ended it, apply the retry policy. Only the process whose move won retries."""
        moved = self.store.move_attempt(
            attempt.id,
            status.state,
            actor=actor,
            reason=status.reason,
            expect=attempt.state,
            exit_code=status.exit_code,
            message=status.message,
            started_at=status.started_at,
            finished_at=status.finished_at,
        )
        if moved and status.state.terminal:
            self._after_end(self.store.get_run(run_id), status)

    def refresh_run_status(self, ref: str) -> RunRecord:
        """Ask the execution plane where the current attempt stands, move its state, and apply
        the retry policy if it ended."""
        run = self.store.get_run(ref)
        attempt = run.current
        if attempt.state.terminal or attempt.handle is None:
            return run
        backend = self.execution.backend(attempt.backend_key)
        try:
            status = backend.status(attempt.handle)
        except Unreachable as exc:
            self._unreachable(run, attempt, exc)
            return self.store.get_run(run.id)
        if attempt.unreachable_since is not None or _contact_is_old(attempt):
            self.store.record_contact(attempt.id, reachable=True, actor="orbit")
        if attempt.cancel_requested and attempt.unreachable_since and not status.state.terminal:
            # a cancel asked for while the host did not answer is delivered now (a repeat is
            # harmless: the wrapper is already stopping)
            with contextlib.suppress(Unreachable):
                backend.cancel(attempt.handle, FailureReason.CANCELLED)
        if status.state in ALLOWED[attempt.state]:
            self._end(run.id, attempt, status, actor="orbit")
        return self.store.get_run(run.id)

    def _unreachable(self, run: RunRecord, attempt: AttemptRecord, exc: Unreachable) -> None:
        """The host did not answer: the attempt keeps its state, marked host_unreachable with
        the time of the last contact. Once every look for the host's unreachable_timeout_s has
        failed (counted from the first failed look, so that a laptop that slept through the
        night does not end a run on its first look back), it ends as terminated
        (host_unreachable), and the retry policy applies."""
        self.store.record_contact(attempt.id, reachable=False, actor="orbit", message=str(exc))
        assert attempt.handle is not None
        timeout = float(attempt.handle.data.get("host", {}).get("unreachable_timeout_s", 600.0))
        since = attempt.unreachable_since
        if since is None:
            return  # the first failed look: only now does the clock start
        silent = (datetime.now(UTC) - since).total_seconds()
        if silent < timeout:
            return
        last = attempt.last_contact_at or attempt.created_at
        message = (
            f"host '{attempt.target}' unreachable for {silent:.0f}s (timeout {timeout:.0f}s; "
            f"last contact {last:%Y-%m-%d %H:%M:%S} UTC): {exc}"
        )
        ended = RunStatus(
            state=RunState.TERMINATED, reason=FailureReason.HOST_UNREACHABLE, message=message
        )
        self._end(run.id, attempt, ended, actor="orbit")

    def _after_end(self, run: RunRecord, status: RunStatus) -> None:
        attempt = run.current
        policy = RetryPolicy.model_validate(run.submission.get("retry", {}))
        retries = 0
        for earlier in reversed(run.attempts):
            if earlier.trigger != "auto_retry":
                break
            retries += 1
        if not should_retry(policy, status, retries, attempt.cancel_requested):
            return
        self.store.record_event(
            "orbit",
            "run.auto_retry",
            run_id=run.id,
            attempt_id=attempt.id,
            reason=status.reason.value if status.reason else None,
            retry=retries + 1,
            max_retries=policy.max_retries,
        )
        request = ExecutionRequest.model_validate(run.request)
        if attempt.target is not None:
            request = request.model_copy(update={"target": attempt.target})
        new = self.store.add_attempt(
            run.id,
            target=attempt.target,
            backend_key=attempt.backend_key,
            trigger="auto_retry",
            actor="orbit",
        )
        self._launch(self.store.get_run(run.id), new, request)

    def refresh_active(self, runs: list[RunRecord]) -> None:
        """Refresh every active run; one whose backend is not available here stays as stored."""
        for run in runs:
            if run.state.terminal:
                continue
            try:
                self.refresh_run_status(run.id)
            except NoBackend:
                continue

    def wait_for(self, ref: str, timeout_s: float | None = None, poll_s: float = 0.5) -> RunRecord:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            run = self.refresh_run_status(ref)
            if run.state.terminal or (deadline is not None and time.monotonic() >= deadline):
                return run
            time.sleep(poll_s)
