"""Launching an attempt, the one launch path every placement takes (a submit, a retry, an
automatic retry once due, a scheduler's placement): claim it, stage and start it under a lease,
and record its handle in one compare-and-set; wait for a host that does not answer; launch a
prepared attempt once due, and adopt one whose launcher died. Every step is safe to run from
two processes at once: each move is a compare-and-set, and only the process whose move won
acts on it. What comes after the launch (look, end, retry) is core/control/lifecycle.py."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

from orbit.core.control.base import ServicePart
from orbit.core.control.leases import LEASE_S, RENEW_S, launcher_id, lease_lapsed, now
from orbit.core.execution.backends.base import (
    AttemptContext,
    KnowsUnplaced,
    LaunchError,
    NoNodeFree,
    ProcessSweep,
)
from orbit.model import failpoints
from orbit.model.errors import OrbitError, Unreachable
from orbit.model.models import (
    ExecutionRequest,
    FailureReason,
    Placement,
    RunState,
    RunStatus,
)
from orbit.model.records import AttemptRecord, RunRecord
from orbit.store.sql import read_json

HOST_WAIT_S = 15.0  # an attempt waiting for its host asks again after this long


class Launching(ServicePart):
    @contextlib.contextmanager
    def _lease(self, attempt_id: str, owner: str) -> Iterator[None]:
        """Keep the launch claim fresh while staging and starting take their time (a large
        bundle over a slow link): a thread renews it until the block ends."""
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(RENEW_S):
                with contextlib.suppress(Exception):  # the next renewal, or the lapse, tells
                    self.store.leases.renew_launch(
                        attempt_id, owner, now() + timedelta(seconds=LEASE_S)
                    )

        thread = threading.Thread(target=renew, name=f"lease-{attempt_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def launch(
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
        if self.parts.gate.held_back(run, attempt):  # `after:`: every placement's gate
            return
        if placement is None and request.backend_key.startswith("agent_pool"):
            # the scheduler places it, with the rest of the queue (core/control/scheduling.py)
            if attempt.lease_owner == launcher_id():  # claimed at its making: handed over
                self.store.leases.defer_launch(attempt.id, attempt.lease_owner, now())
            self.parts.scheduling.request_schedule()
            return
        owner = launcher_id()
        if not self.store.leases.claim_launch(
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
                context = self._with_secrets(run, attempt, request, context)
                try:
                    handle = backend.launch(bundle, request, context)
                except (OrbitError, OSError) as exc:  # a backend's refusal or missing tool
                    raise LaunchError(FailureReason.LAUNCH_FAILED, str(exc)) from exc
                failpoints.hit("after-launch")
        except NoNodeFree as exc:  # the plan was stale: the next pass places it
            self.store.leases.defer_launch(attempt.id, owner, now(), message=str(exc))
            self.parts.scheduling.request_schedule()
            return
        except LaunchError as exc:
            if exc.reason is FailureReason.HOST_UNREACHABLE:
                self._wait_for_host(run, self.store.runs.get_attempt(attempt.id), str(exc), owner)
                return
            ended = RunStatus(state=RunState.FAILED, reason=exc.reason, message=str(exc))
            self.parts.lifecycle.end(run.id, attempt, ended, actor=actor)
            return
        extra: dict[str, Any] = {
            k: handle.data[k] for k in ("staged_bytes", "bundle_cached") if k in handle.data
        }
        recorded = self.store.attempts.record_launch(attempt.id, handle, actor=actor, **extra)
        stopped = handle.data.get("processes_stopped")
        if stopped:  # the launch swept its host first: what that stopped is audited too
            swept = ProcessSweep({str(a): tuple(p) for a, p in stopped.items()})
            self.hosts.record_stopped(handle.target, swept, actor="orbit")
        now_known = self.store.runs.get_attempt(attempt.id)
        if not recorded and (
            now_known.handle is None or now_known.handle.location != handle.location
        ):
            # another process judged the attempt while this launch went on (its lease had
            # lapsed): what this launch started is nobody's, so it is stopped
            with contextlib.suppress(OrbitError):
                backend.cancel(handle, FailureReason.CANCELLED)
            self.store.audit.record_event(
                "orbit", "attempt.launch_discarded", run_id=run.id, attempt_id=attempt.id
            )
        elif now_known.cancel_requested and not now_known.state.terminal:
            # cancelled while it was being launched: the cancel reaches it now
            with contextlib.suppress(OrbitError):
                backend.cancel(handle, FailureReason.CANCELLED)

    def _with_secrets(
        self,
        run: RunRecord,
        attempt: AttemptRecord,
        request: ExecutionRequest,
        context: AttemptContext,
    ) -> AttemptContext:
        """The attempt with its run's secrets, resolved again for this launch: a rotated value
        is the one used, and one removed since the submit fails the launch (launch_failed,
        saying which), not the task. An agent's node is handed them only when it claims the
        start (server/agents/sessions.py): here they are only checked."""
        if not request.secrets:
            return context
        try:
            if request.backend_key.startswith("agent_pool"):
                self.parts.secrets.uses(request.secrets, run.created_by, run.experiment_id)
                return context
            return replace(context, secrets=self.parts.secrets.deliver(run, attempt.id))
        except OrbitError as exc:
            raise LaunchError(FailureReason.LAUNCH_FAILED, str(exc)) from None

    def _wait_for_host(
        self, run: RunRecord, attempt: AttemptRecord, message: str, owner: str | None
    ) -> None:
        """The attempt's host did not answer at launch. Like a running attempt whose host went
        quiet, it keeps its state (prepared), marked host_unreachable, and is launched when the
        host answers; after the host's unreachable timeout it ends terminated
        (host_unreachable), the same end as a running attempt's for the same cause. `owner`
        gives up its claim (a launch to try again later); without one (an adoption) the claim
        stays, so the next look tries to adopt it again."""
        self.store.attempts.record_contact(
            attempt.id, reachable=False, actor="orbit", message=message
        )
        attempt = self.store.runs.get_attempt(attempt.id)
        timeout = self.unreachable_timeout(attempt)
        since = attempt.unreachable_since or now()
        if (now() - since).total_seconds() >= timeout:
            ended = RunStatus(
                state=RunState.TERMINATED,
                reason=FailureReason.HOST_UNREACHABLE,
                message=f"host '{attempt.target}' unreachable for {timeout:.0f}s: {message}",
            )
            self.parts.lifecycle.end(run.id, attempt, ended, actor="orbit")
            return
        if owner is not None:
            wait = min(HOST_WAIT_S, timeout / 4)  # ask a few times before the timeout ends it
            self.store.leases.defer_launch(attempt.id, owner, now() + timedelta(seconds=wait))

    def unreachable_timeout(self, attempt: AttemptRecord) -> float:
        if attempt.handle is not None:
            host = attempt.handle.data.get("host", {})
            return float(host.get("unreachable_timeout_s", 600.0))
        found = self.store.hosts.find(attempt.target) if attempt.target else None
        return found.spec.unreachable_timeout_s if found is not None else 600.0

    def advance_prepared(self, run: RunRecord, attempt: AttemptRecord) -> None:
        """A prepared attempt: launch it once due (a retry after its backoff, an attempt
        waiting for its host), unless a live process is launching it. One whose launcher died
        is judged where it was to run: adopted if it started, staging_failed if not."""
        at = now()
        if not lease_lapsed(attempt, at):
            return  # being launched right now
        if attempt.lease_owner is not None:
            self._adopt(run, attempt)
            return
        waits = attempt.not_before is not None and attempt.not_before > at
        if waits and not (attempt.held and self.config.looks_on_read):  # embedded: a look judges it
            return  # its backoff, its wait for the host or for its dependencies is not over
        self.launch(run, attempt, self.request_for(run, attempt))

    def _gpus_of(self, attempt: AttemptRecord) -> tuple[int, ...] | None:
        """The GPUs the scheduler gave an attempt it overflowed onto an SSH host (None for any
        other: an agent pins its own, a run sent to a host directly takes what it finds)."""
        if not attempt.backend_key.startswith("ssh_"):
            return None
        row = self.store.placement.attempt_placement(attempt.id)
        given = read_json(row["node_gpus"]) if row is not None else None
        return tuple(int(i) for i in given["indices"]) if given else None

    @staticmethod
    def request_for(run: RunRecord, attempt: AttemptRecord) -> ExecutionRequest:
        """The run's request, aimed at the attempt's own target."""
        request = run.request
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
        if not self.store.leases.claim_launch(
            attempt.id, owner, now() + timedelta(seconds=LEASE_S), expect=attempt.lease_owner
        ):
            return
        request = self.request_for(run, attempt)
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
            self.launch(run, self.store.runs.get_attempt(attempt.id), request)  # nothing to adopt
            return
        if handle is None:
            ended = RunStatus(
                state=RunState.FAILED,
                reason=FailureReason.STAGING_FAILED,
                message=f"the process launching it ({launcher}) stopped before it started: {why}",
            )
            self.parts.lifecycle.end(run.id, attempt, ended, actor="orbit")
            return
        self.store.attempts.record_launch(attempt.id, handle, actor="orbit", adopted_from=launcher)
