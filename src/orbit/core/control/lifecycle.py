"""An attempt's life once launched, as the control plane drives it: look at it where it runs,
end it, and let the retry policy start the next one after its backoff (the launch itself:
core/control/launching.py). Embedded, this runs whenever a command looks at a run; the
server's loops will call the same methods with nobody looking. Every step is safe to run from
two processes at once: each move is a compare-and-set, and only the process whose move won
acts on it."""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta

from orbit.core.control.base import ServicePart
from orbit.core.control.leases import LEASE_S, launcher_id, now
from orbit.core.control.waiting import wait_until_ended
from orbit.core.execution.leftovers import sweep_after_contact
from orbit.model.errors import NoBackend, OrbitError, Unreachable
from orbit.model.models import FailureReason, RunState, RunStatus
from orbit.model.records import AttemptRecord, RunRecord
from orbit.model.retry import backoff_delay, should_retry
from orbit.model.states import ALLOWED
from orbit.store.attempt_states import AutoRetry


def _contact_is_old(attempt: AttemptRecord, every_s: float = 1.0) -> bool:
    """Whether the last recorded contact is old enough to be worth a write."""
    last = attempt.last_contact_at
    return last is None or (now() - last).total_seconds() >= every_s


class Lifecycle(ServicePart):
    def end(self, run_id: str, attempt: AttemptRecord, status: RunStatus, actor: str) -> None:
        """Move the attempt to where its status says (compare-and-set on the state it had) and,
        when that ends it, open the retry its policy asks for in the same move: the run is
        never seen ended while a retry is to come, and a crash cannot lose the retry. Only
        the process whose move won retries; it launches a retry without backoff at once."""
        retry = (
            self._retry_for(self.store.runs.get_run(run_id), status)
            if status.state.terminal
            else None
        )
        moved = self.store.attempts.move_attempt(
            attempt.id,
            status.state,
            actor=actor,
            reason=status.reason,
            expect=attempt.state,
            exit_code=status.exit_code,
            message=status.message,
            started_at=status.started_at,
            finished_at=status.finished_at,
            retry=retry,
        )
        if not moved or retry is None or retry.launcher is None:
            return
        run = self.store.runs.get_run(run_id)
        new = run.current
        if new.number == attempt.number + 1 and new.lease_owner == retry.launcher[0]:
            self.parts.launching.launch(run, new, self.parts.launching.request_for(run, new))

    def refresh_run_status(self, ref: str) -> RunRecord:
        """Ask the execution plane where the current attempt stands, move its state, and apply
        the retry policy if it ended. A prepared attempt is launched once due."""
        run = self.store.runs.get_run(ref)
        attempt = run.current
        if attempt.state.terminal:
            return run
        if attempt.handle is None:
            if attempt.state is RunState.PREPARED:
                self.parts.launching.advance_prepared(run, attempt)
                run = self.store.runs.get_run(run.id)
            if run.current.handle is None or run.current.state.terminal:
                return run
            attempt = run.current
        assert attempt.handle is not None
        backend = self.execution.backend(attempt.backend_key)
        try:
            status = backend.status(attempt.handle)
        except Unreachable as exc:
            self._unreachable(run, attempt, exc)
            return self.store.runs.get_run(run.id)
        if attempt.unreachable_since is not None or _contact_is_old(attempt):
            self.store.attempts.record_contact(attempt.id, reachable=True, actor="orbit")
        if attempt.unreachable_since is not None:  # back: stop what was given up on meanwhile
            live = self.store.hosts.active_attempts()
            swept = sweep_after_contact(self.execution, attempt, live)
            if swept is not None:
                self.hosts.record_stopped(attempt.target or "", swept, actor="orbit")
        if attempt.cancel_requested and attempt.unreachable_since and not status.state.terminal:
            # a cancel asked for while the host did not answer is delivered now (a repeat is
            # harmless: the wrapper is already stopping)
            with contextlib.suppress(Unreachable):
                backend.cancel(attempt.handle, FailureReason.CANCELLED)
        if status.state in ALLOWED[attempt.state]:
            self.end(run.id, attempt, status, actor="orbit")
        elif status.state is attempt.state is RunState.PROVISIONING and status.message:
            # still waiting where it runs (Slurm's pending reason, its estimated start): the
            # newest word, not the one of the move to provisioning
            if status.message != attempt.message or attempt.unreachable_since is not None:
                self.store.attempts.note_attempt(attempt.id, status.state, status.message)
        elif not status.state.terminal:
            self._enforce_max_runtime(run, attempt, status)
        return self.store.runs.get_run(run.id)

    def _enforce_max_runtime(
        self, run: RunRecord, attempt: AttemptRecord, status: RunStatus
    ) -> None:
        """A running attempt past its max_runtime_s is stopped gracefully, once; it ends
        terminated (max_runtime), a reason of its own, and is not retried."""
        limit = run.request.max_runtime_s
        started = status.started_at or attempt.started_at
        if not limit or started is None or attempt.cancel_requested or attempt.handle is None:
            return
        if (now() - started).total_seconds() < limit:
            return
        self.store.attempts.request_cancel(attempt.id, "orbit")
        self.store.audit.record_event(
            "orbit", "attempt.max_runtime", run_id=run.id, attempt_id=attempt.id, limit_s=limit
        )
        with contextlib.suppress(OrbitError):
            self.execution.backend(attempt.backend_key).cancel(
                attempt.handle, FailureReason.MAX_RUNTIME
            )

    def _unreachable(self, run: RunRecord, attempt: AttemptRecord, exc: Unreachable) -> None:
        """The host did not answer: the attempt keeps its state, marked host_unreachable with
        the time of the last contact. Once every look for the host's unreachable_timeout_s has
        failed (counted from the first failed look, so that a laptop that slept through the
        night does not end a run on its first look back), it ends as terminated
        (host_unreachable), and the retry policy applies."""
        self.store.attempts.record_contact(
            attempt.id, reachable=False, actor="orbit", message=str(exc)
        )
        timeout = self.parts.launching.unreachable_timeout(attempt)
        since = attempt.unreachable_since
        if since is None:
            return  # the first failed look: only now does the clock start
        silent = (now() - since).total_seconds()
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
        self.end(run.id, attempt, ended, actor="orbit")

    def _retry_for(self, run: RunRecord, status: RunStatus) -> AutoRetry | None:
        """The retry policy for the run's current attempt ending with `status`: the new
        attempt to open with the end (launched at once, or once its backoff is over), or
        None. (The store opens none if a cancel was asked for by the time the end is made.)"""
        attempt = run.current
        policy = run.submission.retry
        if status.reason is FailureReason.PREEMPTED and attempt.preempted_by is not None:
            # pushed off by the scheduler: it goes on at once, whatever its retries so far,
            # unless a person cancelled it meanwhile
            if attempt.cancel_requested:
                return None
            said = {"reason": status.reason.value, "preempted_for": attempt.preempted_by}
            return AutoRetry(event=said, launcher=self.claim())
        retries = 0
        for n, earlier in enumerate(reversed(run.attempts)):
            if earlier.trigger != "auto_retry":
                break
            before = run.attempts[-n - 2] if n + 2 <= len(run.attempts) else None
            if before is None or before.reason is not FailureReason.PREEMPTED:
                retries += 1  # a retry after a preemption is not one the policy counts
        if not should_retry(policy, status, retries, attempt.cancel_requested):
            return None
        delay = backoff_delay(policy, retries)
        if status.reason is FailureReason.NODE_LOST:
            # its node, cut off, stops it itself (orbit.agent.fencing): the retry waits for
            # that, so that the two never run at once
            delay = max(delay, self.fence_wait_s(attempt))
        event = {
            "reason": status.reason.value if status.reason else None,
            "retry": retries + 1,
            "max_retries": policy.max_retries,
            "backoff_s": delay,
        }
        if delay > 0:
            return AutoRetry(event=event, not_before=now() + timedelta(seconds=delay))
        return AutoRetry(event=event, launcher=self.claim())

    @staticmethod
    def claim() -> tuple[str, datetime]:
        """A launch claim for this process, for an attempt made to be launched at once."""
        return launcher_id(), now() + timedelta(seconds=LEASE_S)

    def wait_for(self, ref: str, timeout_s: float | None = None, poll_s: float = 0.5) -> RunRecord:
        """The run once it ended, or as it stands after `timeout_s` seconds."""
        return wait_until_ended(self.refresh_run_status, ref, timeout_s, poll_s)

    def refresh_active(self, runs: list[RunRecord]) -> None:
        """Refresh every active run; one whose backend is not available here stays as stored."""
        for run in runs:
            if run.state.terminal:
                continue
            try:
                self.refresh_run_status(run.id)
            except NoBackend:
                continue
