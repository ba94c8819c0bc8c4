"""The server's reconcile loop: runs advance, retry and time out with nobody looking. Each pass
claims the active attempts that are due under a lease in the store (FOR UPDATE SKIP LOCKED on
PostgreSQL), so that replicas share the work and never look at one attempt together; each look
is the same refresh a command does embedded, whose every move is a compare-and-set, so that
even a lease that lapsed mid-look cannot launch, retry or end an attempt twice. The leases of
a replica of this host that is gone (killed mid-look, then restarted) are released at once
rather than left to run out."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

from orbit.core.control.leases import launcher_id, process_gone
from orbit.core.control.service import CoreControlService
from orbit.model.errors import NoBackend, OrbitError
from orbit.server.metrics import Metrics

log = logging.getLogger("orbit.server.loops")

LOOK_LEASE_S = 60.0  # a look that takes longer than this (a host timing out) may be taken over
RELEASE_EVERY_S = 10.0  # how often a replica asks whether a lease holder of its host is gone
OWNER_PREFIX = "reconcile:"


class Reconciler:
    def __init__(
        self, service: CoreControlService, metrics: Metrics, every_s: float, workers: int
    ) -> None:
        self.service = service
        self.metrics = metrics
        self.every_s = every_s
        self.owner = f"{OWNER_PREFIX}{launcher_id()}"
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reconcile")
        self.capacity = workers  # looks in flight at once
        self._busy = 0
        self._lock = threading.Lock()
        self._released_at: float | None = None
        self._stop = threading.Event()
        self._poked = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reconciler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def poke(self) -> None:
        """Run a pass now, not at the next period: an attempt was made due (an agent reported
        it ended), or a look ended one, and what waited for its slot is due."""
        self._poked.set()

    def stop(self) -> None:
        self._stop.set()
        self._poked.set()
        self._thread.join(timeout=10)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            poked = self._poked.wait(max(0.0, due - time.monotonic()))
            self._poked.clear()
            if self._stop.is_set():
                return
            if not poked:
                self.metrics.loop_lag.set(max(0.0, time.monotonic() - due))
            started = time.perf_counter()
            try:
                self.run_pass()
            except Exception:  # the store is away, say: the next pass tries again
                log.exception("a reconcile pass failed")
            self.metrics.loop_pass.observe(time.perf_counter() - started)
            if not poked:  # a poked pass comes between two periodic ones
                due += self.every_s
                due = max(due, time.monotonic() - self.every_s)  # after a long pass: no burst

    def release_the_gone(self) -> list[str]:
        """Make the attempts whose reconcile leases a gone process of this host holds due now.
        Without this, a server killed mid-look and restarted (or a replica beside one that
        was killed) would leave those attempts unlooked-at for LOOK_LEASE_S. Returns the
        owners released."""
        at = datetime.now(UTC)
        released = []
        for owner in self.service.store.leases.reconcile_holders(at):
            if owner.startswith(OWNER_PREFIX) and process_gone(owner[len(OWNER_PREFIX) :]):
                count = self.service.store.leases.release_reconcile(owner, at)
                log.info("released %d reconcile leases of %s, which is gone", count, owner)
                released.append(owner)
        return released

    def run_pass(self) -> int:
        """Claim what is due, as much as there are free workers for, and hand it to them; a
        slow look (a host timing out) holds one worker, not the whole pass. How many were
        handed out."""
        handed = 0
        if self._released_at is None or time.monotonic() - self._released_at >= RELEASE_EVERY_S:
            self._released_at = time.monotonic()
            self.release_the_gone()
        while not self._stop.is_set():
            with self._lock:
                free = self.capacity - self._busy
            if free <= 0:
                return handed
            at = datetime.now(UTC)
            claimed = self.service.store.leases.claim_reconcile(
                self.owner,
                at=at,
                lease_until=at + timedelta(seconds=LOOK_LEASE_S),
                limit=free,
            )
            for item in claimed:
                with self._lock:
                    self._busy += 1
                self.pool.submit(self._look, item, at)
            handed += len(claimed)
            if len(claimed) < free:
                return handed
        return handed

    def _look(self, claimed: tuple[str, str], at: datetime) -> None:
        run_id, attempt_id = claimed
        ended = False
        try:
            run = self.service.refresh_run_status(run_id)
            ended = run.current.id != attempt_id or run.current.state.terminal
        except NoBackend:
            pass  # not run from here (an agent's, say): left as stored
        except OrbitError as exc:
            self.metrics.loop_errors.inc()
            log.warning("run %s: %s", run_id, exc)
        except Exception:
            self.metrics.loop_errors.inc()
            log.exception("run %s: the look failed", run_id)
        finally:
            with self._lock:
                self._busy -= 1
            self.metrics.reconciled.inc()
            # due again a period after it was claimed (not after the look ended, which would
            # stretch the period by the look's own time)
            next_due = max(at + timedelta(seconds=self.every_s), datetime.now(UTC))
            try:
                self.service.store.leases.reconcile_done(attempt_id, self.owner, next_due)
            except Exception:
                log.exception("attempt %s: could not record the look", attempt_id)
        if ended:  # it ended (or was retried): what waited for its slot is due now, and this
            self.poke()  # worker is free again for the pass that takes it


class SchedulerLoop:
    """The scheduler's passes, on a thread of their own: a submit, a freed slot or a node that
    joins asks for one (poke) and goes on at once; the pass places the whole queue. It also
    runs every `every_s`, so that a run waiting on an aged reservation or a node coming back
    online is looked at with nobody asking."""

    def __init__(self, service: CoreControlService, metrics: Metrics, every_s: float) -> None:
        self.service = service
        self.metrics = metrics
        self.every_s = every_s
        self._stop = threading.Event()
        self._poked = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def poke(self) -> None:
        self._poked.set()

    def stop(self) -> None:
        self._stop.set()
        self._poked.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._poked.wait(self.every_s)
            self._poked.clear()
            if self._stop.is_set():
                return
            try:
                plan = self.service.schedule_pass()
                if plan is not None:
                    self.metrics.fleet.observe_pass(plan.decisions)
            except Exception:  # the store is away, say: the next pass tries again
                self.metrics.loop_errors.inc()
                log.exception("a scheduler pass failed")
