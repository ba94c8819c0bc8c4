"""An attempt's life as the control plane drives it: launch it under a lease, look at it where
it runs, end it, and let the retry policy start the next one after its backoff. Embedded, this
runs whenever a command looks at a run; the server's loops will call the same methods with
nobody looking. Every step is safe to run from two processes at once: each move is a
compare-and-set, and only the process whose move won acts on it."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from orbit.core import failpoints
from orbit.core.control.base import ServiceBase
from orbit.core.control.waiting import WaitsForRuns
from orbit.core.errors import NoBackend, OrbitError, Unreachable
from orbit.core.execution.backends.base import (
    AttemptContext,
    KnowsUnplaced,
    LaunchError,
    NoNodeFree,
    ProcessSweep,
)
from orbit.core.execution.leftovers import sweep_after_contact
from orbit.core.models import (
    ExecutionRequest,
    FailureReason,
    Placement,
    RetryPolicy,
    RunState,
    RunStatus,
)
from orbit.core.records import AttemptRecord, RunRecord
from orbit.core.retry import backoff_delay, should_retry
from orbit.core.states import ALLOWED
from orbit.store.runs import AutoRetry
from orbit.store.sql import read_json

LEASE_S = 30.0  # a launch claim lapses this long after its last renewal
RENEW_S = 10.0  # a launching process renews its claim this often
HOST_WAIT_S = 15.0  # an attempt waiting for its host asks again after this long
NODE_WAIT_S = 300.0  # an attempt waiting for a free node is woken when a slot frees (an
# attempt on a node ends, a node joins, syncs or gets room: store.runs.wake_waiting_for_nodes),
# oldest first, each passing a slot it cannot use on to the next; this long is a safety net


def now() -> datetime:
    return datetime.now(UTC)


def launcher_id() -> str:
    """Who is launching: this host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def process_gone(owner: str) -> bool:
    """Whether `owner` (HOST:PID, as `launcher_id` names a process) is a process of this host
    that no longer exists. Another host's process can only be judged by its lease."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def lease_lapsed(attempt: AttemptRecord, at: datetime) -> bool:
    """Whether the process that claimed the launch is known gone: its lease ran out, or it was
    a process of this host that no longer exists."""
    if attempt.lease_owner is None:
        return True
    if attempt.lease_expires_at is None or attempt.lease_expires_at <= at:
        return True
    return process_gone(attempt.lease_owner)


def _contact_is_old(attempt: AttemptRecord, every_s: float = 1.0) -> bool:
    """Whether the last recorded contact is old enough to be worth a write."""
    last = attempt.last_contact_at
    return last is None or (now() - last).total_seconds() >= every_s


class Lifecycle(ServiceBase, WaitsForRuns):
    @contextlib.contextmanager
    def _lease(self, attempt_id: str, owner: str) -> Iterator[None]:
        """Keep the launch claim fresh while staging and starting take their time (a large
        bundle over a slow link): a thread renews it until the block ends."""
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(RENEW_S):
                with contextlib.suppress(Exception):  # the next renewal, or the lapse, tells
                    self.store.renew_launch(attempt_id, owner, now() + timedelta(seconds=LEASE_S))

        thread = threading.Thread(target=renew, name=f"lease-{attempt_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _launch(
        self,
        run: RunRecord,
        attempt: AttemptRecord,
        request: ExecutionRequest,
        actor: str = "orbit",
        placement: dict[str, Any] | None = None,
    ) -> None:
        """Claim the attempt, stage and start it, then record its handle and the move to
        submitted in one compare-and-set. A launch that failed ends the attempt (and may retry
        it); one whose host does not answer waits for it, as a running attempt does. If this
        process dies before the record, the next look finds the attempt where it was to run
        (see _adopt). `actor` is who asked (a submit, a retry); a launch that only comes due
        (an automatic retry after its backoff) is ORBIT's own, whoever happened to look."""
        if failpoints.skips("launch"):
            return
        if placement is None and request.backend_key.startswith("agent_pool"):
            # the scheduler places it, with the rest of the queue (core/control/scheduling.py)
            if attempt.lease_owner == launcher_id():  # claimed at its making: handed over
                self.store.defer_launch(attempt.id, attempt.lease_owner, now())
            self.request_schedule()
            return
        owner = launcher_id()
        if not self.store.claim_launch(
            attempt.id, owner, now() + timedelta(seconds=LEASE_S), expect=attempt.lease_owner
        ):
            return  # another process claimed it first
        backend = self.execution.backend(request.backend_key)
        context = AttemptContext(
            run_id=run.id, attempt_id=attempt.id, placement=placement, gpus=self._gpus_of(attempt)
        )
        try:
            with self._lease(attempt.id, owner):
                failpoints.hit("before-launch")
                try:
                    bundle = self._bundle(run.bundle_digest)
                except OrbitError as exc:
                    raise LaunchError(FailureReason.STAGING_FAILED, str(exc)) from None
                try:
                    handle = backend.launch(bundle, request, context)
                except (OrbitError, OSError) as exc:  # a backend's refusal or missing tool
                    raise LaunchError(FailureReason.LAUNCH_FAILED, str(exc)) from exc
                failpoints.hit("after-launch")
        except NoNodeFree as exc:  # the plan was stale: the next pass places it
            self.store.defer_launch(attempt.id, owner, now(), message=str(exc))
            self.request_schedule()
            return
        except LaunchError as exc:
            if exc.reason is FailureReason.HOST_UNREACHABLE:
                self._wait_for_host(run, self.store.get_attempt(attempt.id), str(exc), owner)
                return
            ended = RunStatus(state=RunState.FAILED, reason=exc.reason, message=str(exc))
            self._end(run.id, attempt, ended, actor=actor)
            return
        extra: dict[str, Any] = {
            k: handle.data[k] for k in ("staged_bytes", "bundle_cached") if k in handle.data
        }
        recorded = self.store.record_launch(attempt.id, handle, actor=actor, **extra)
        stopped = handle.data.get("processes_stopped")
        if stopped:  # the launch swept its host first: what that stopped is audited too
            swept = ProcessSweep({str(a): tuple(p) for a, p in stopped.items()})
            self.hosts.record_stopped(handle.target, swept, actor="orbit")
        now_known = self.store.get_attempt(attempt.id)
        if not recorded and (
            now_known.handle is None or now_known.handle.location != handle.location
        ):
            # another process judged the attempt while this launch went on (its lease had
            # lapsed): what this launch started is nobody's, so it is stopped
            with contextlib.suppress(OrbitError):
                backend.cancel(handle, FailureReason.CANCELLED)
            self.store.record_event(
                "orbit", "attempt.launch_discarded", run_id=run.id, attempt_id=attempt.id
            )
        elif now_known.cancel_requested and not now_known.state.terminal:
            # cancelled while it was being launched: the cancel reaches it now
            with contextlib.suppress(OrbitError):
                backend.cancel(handle, FailureReason.CANCELLED)

    def request_schedule(self) -> None:
        """Have the scheduler run a pass (core/control/scheduling.py)."""
        raise NotImplementedError

    def _wait_for_host(
        self, run: RunRecord, attempt: AttemptRecord, message: str, owner: str | None
    ) -> None:
        """The attempt's host did not answer at launch. Like a running attempt whose host went
        quiet, it keeps its state (prepared), marked host_unreachable, and is launched when the
        host answers; after the host's unreachable timeout it ends terminated
        (host_unreachable), the same end as a running attempt's for the same cause. `owner`
        gives up its claim (a launch to try again later); without one (an adoption) the claim
        stays, so the next look tries to adopt it again."""
        self.store.record_contact(attempt.id, reachable=False, actor="orbit", message=message)
        attempt = self.store.get_attempt(attempt.id)
        timeout = self._unreachable_timeout(attempt)
        since = attempt.unreachable_since or now()
        if (now() - since).total_seconds() >= timeout:
            ended = RunStatus(
                state=RunState.TERMINATED,
                reason=FailureReason.HOST_UNREACHABLE,
                message=f"host '{attempt.target}' unreachable for {timeout:.0f}s: {message}",
            )
            self._end(run.id, attempt, ended, actor="orbit")
            return
        if owner is not None:
            wait = min(HOST_WAIT_S, timeout / 4)  # ask a few times before the timeout ends it
            self.store.defer_launch(attempt.id, owner, now() + timedelta(seconds=wait))

    def _unreachable_timeout(self, attempt: AttemptRecord) -> float:
        if attempt.handle is not None:
            host = attempt.handle.data.get("host", {})
            return float(host.get("unreachable_timeout_s", 600.0))
        found = self.store.hosts.find(attempt.target) if attempt.target else None
        return found.spec.unreachable_timeout_s if found is not None else 600.0

    def _end(self, run_id: str, attempt: AttemptRecord, status: RunStatus, actor: str) -> None:
        """Move the attempt to where its status says (compare-and-set on the state it had) and,
        when that ends it, open the retry its policy asks for in the same move: the run is
        never seen ended while a retry is to come, and a crash cannot lose the retry. Only
        the process whose move won retries; it launches a retry without backoff at once."""
        retry = (
            self._retry_for(self.store.get_run(run_id), status) if status.state.terminal else None
        )
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
            retry=retry,
        )
        if not moved or retry is None or retry.launcher is None:
            return
        run = self.store.get_run(run_id)
        new = run.current
        if new.number == attempt.number + 1 and new.lease_owner == retry.launcher[0]:
            self._launch(run, new, self._request_for(run, new))

    def _advance_prepared(self, run: RunRecord, attempt: AttemptRecord) -> None:
        """A prepared attempt: launch it once due (a retry after its backoff, an attempt
        waiting for its host), unless a live process is launching it. One whose launcher died
        is judged where it was to run: adopted if it started, staging_failed if not."""
        at = now()
        if not lease_lapsed(attempt, at):
            return  # being launched right now
        if attempt.lease_owner is not None:
            self._adopt(run, attempt)
            return
        if attempt.not_before is not None and attempt.not_before > at:
            return  # its backoff, or its wait for the host, is not over
        self._launch(run, attempt, self._request_for(run, attempt))

    def _gpus_of(self, attempt: AttemptRecord) -> tuple[int, ...] | None:
        """The GPUs the scheduler gave an attempt it overflowed onto an SSH host (None for any
        other: an agent pins its own, a run sent to a host directly takes what it finds)."""
        if not attempt.backend_key.startswith("ssh_"):
            return None
        row = self.store.attempt_placement(attempt.id)
        given = read_json(row["node_gpus"]) if row is not None else None
        return tuple(int(i) for i in given["indices"]) if given else None

    @staticmethod
    def _request_for(run: RunRecord, attempt: AttemptRecord) -> ExecutionRequest:
        """The run's request, aimed at the attempt's own target."""
        request = ExecutionRequest.model_validate(run.request)
        if attempt.target is not None:
            request = request.model_copy(update={"target": attempt.target})
        if request.placement.kind == "agent_pool" and attempt.backend_key.startswith("ssh_"):
            # a pool run the scheduler overflowed onto an SSH host: that host's now
            request = request.model_copy(update={"placement": Placement(kind="ssh")})
        return request

    def _adopt(self, run: RunRecord, attempt: AttemptRecord) -> None:
        """The process launching this attempt died (killed while staging, or between the start
        and its record). Find out where it was to run: started, it is adopted and goes on from
        its true state; never started, it ends as staging_failed (and the retry policy may try
        again), or, never placed where placing is one fenced transaction (an agent pool), it
        is launched now. Either way it never starts twice."""
        owner = launcher_id()
        if not self.store.claim_launch(
            attempt.id, owner, now() + timedelta(seconds=LEASE_S), expect=attempt.lease_owner
        ):
            return
        request = self._request_for(run, attempt)
        backend = self.execution.backend(attempt.backend_key)
        context = AttemptContext(run_id=run.id, attempt_id=attempt.id)
        launcher = attempt.lease_owner
        try:
            handle = backend.locate(request, context)
        except Unreachable as exc:  # may have started there: only the host can tell
            self._wait_for_host(run, attempt, str(exc), owner=None)
            return
        except OrbitError as exc:  # its host is no longer registered, say
            handle, why = None, str(exc)
        else:
            why = "its folder was never made where it was to run"
        if handle is None and isinstance(backend, KnowsUnplaced) and backend.never_placed(context):
            self._launch(run, self.store.get_attempt(attempt.id), request)  # nothing to adopt
            return
        if handle is None:
            ended = RunStatus(
                state=RunState.FAILED,
                reason=FailureReason.STAGING_FAILED,
                message=f"the process launching it ({launcher}) stopped before it started: {why}",
            )
            self._end(run.id, attempt, ended, actor="orbit")
            return
        self.store.record_launch(attempt.id, handle, actor="orbit", adopted_from=launcher)

    def refresh_run_status(self, ref: str) -> RunRecord:
        """Ask the execution plane where the current attempt stands, move its state, and apply
        the retry policy if it ended. A prepared attempt is launched once due."""
        run = self.store.get_run(ref)
        attempt = run.current
        if attempt.state.terminal:
            return run
        if attempt.handle is None:
            if attempt.state is RunState.PREPARED:
                self._advance_prepared(run, attempt)
                run = self.store.get_run(run.id)
            if run.current.handle is None or run.current.state.terminal:
                return run
            attempt = run.current
        assert attempt.handle is not None
        backend = self.execution.backend(attempt.backend_key)
        try:
            status = backend.status(attempt.handle)
        except Unreachable as exc:
            self._unreachable(run, attempt, exc)
            return self.store.get_run(run.id)
        if attempt.unreachable_since is not None or _contact_is_old(attempt):
            self.store.record_contact(attempt.id, reachable=True, actor="orbit")
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
            self._end(run.id, attempt, status, actor="orbit")
        elif status.state is attempt.state is RunState.PROVISIONING and status.message:
            # still waiting where it runs (Slurm's pending reason, its estimated start): the
            # newest word, not the one of the move to provisioning
            if status.message != attempt.message or attempt.unreachable_since is not None:
                self.store.note_attempt(attempt.id, status.state, status.message)
        elif not status.state.terminal:
            self._enforce_max_runtime(run, attempt, status)
        return self.store.get_run(run.id)

    def _enforce_max_runtime(
        self, run: RunRecord, attempt: AttemptRecord, status: RunStatus
    ) -> None:
        """A running attempt past its max_runtime_s is stopped gracefully, once; it ends
        terminated (max_runtime), a reason of its own, and is not retried."""
        limit = run.request.get("max_runtime_s")
        started = status.started_at or attempt.started_at
        if not limit or started is None or attempt.cancel_requested or attempt.handle is None:
            return
        if (now() - started).total_seconds() < float(limit):
            return
        self.store.request_cancel(attempt.id, "orbit")
        self.store.record_event(
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
        self.store.record_contact(attempt.id, reachable=False, actor="orbit", message=str(exc))
        timeout = self._unreachable_timeout(attempt)
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
        self._end(run.id, attempt, ended, actor="orbit")

    def _retry_for(self, run: RunRecord, status: RunStatus) -> AutoRetry | None:
        """The retry policy for the run's current attempt ending with `status`: the new
        attempt to open with the end (launched at once, or once its backoff is over), or
        None. (The store opens none if a cancel was asked for by the time the end is made.)"""
        attempt = run.current
        policy = RetryPolicy.model_validate(run.submission.get("retry", {}))
        if status.reason is FailureReason.PREEMPTED and attempt.preempted_by is not None:
            # pushed off by the scheduler: it goes on at once, whatever its retries so far,
            # unless a person cancelled it meanwhile
            if attempt.cancel_requested:
                return None
            said = {"reason": status.reason.value, "preempted_for": attempt.preempted_by}
            return AutoRetry(event=said, launcher=self._claim())
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
        event = {
            "reason": status.reason.value if status.reason else None,
            "retry": retries + 1,
            "max_retries": policy.max_retries,
            "backoff_s": delay,
        }
        if delay > 0:
            return AutoRetry(event=event, not_before=now() + timedelta(seconds=delay))
        return AutoRetry(event=event, launcher=self._claim())

    @staticmethod
    def _claim() -> tuple[str, datetime]:
        """A launch claim for this process, for an attempt made to be launched at once."""
        return launcher_id(), now() + timedelta(seconds=LEASE_S)

    def refresh_active(self, runs: list[RunRecord]) -> None:
        """Refresh every active run; one whose backend is not available here stays as stored."""
        for run in runs:
            if run.state.terminal:
                continue
            try:
                self.refresh_run_status(run.id)
            except NoBackend:
                continue
