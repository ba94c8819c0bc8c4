"""The server's gc loop: the retention rules of its config's `storage:` applied every
`gc_every_s`, with nobody asking. Replicas take turns through one row of the store (one
compare-and-set a pass: two replicas never run the same pass), and every removal is written
before its files go, so a pass cut short is finished by the next."""

from __future__ import annotations

import logging
import threading

from orbit.core.control.leases import launcher_id
from orbit.core.control.service import CoreControlService
from orbit.core.storage.disk import human

log = logging.getLogger("orbit.server.gc")

ACTOR = "orbit-gc"  # who the audit trail says removed what a pass removed
LOOK_EVERY_S = 60.0  # how often a replica asks whether a pass is due


class GcLoop:
    def __init__(self, service: CoreControlService, every_s: float) -> None:
        self.service = service
        self.every_s = every_s
        self.holder = f"gc:{launcher_id()}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gc", daemon=True)

    def start(self) -> None:
        if self.every_s > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        full = True  # this server's first pass looks at every run (its rules may be new)
        while not self._stop.wait(min(self.every_s, LOOK_EVERY_S)):
            try:
                with self.service.acting_as(ACTOR):
                    report = self.service.gc_if_due(self.holder, self.every_s, full)
            except Exception:  # the store is away, say: the next look tries again
                log.exception("a gc pass failed")
                continue
            full = full and report is None
            if report is not None and report.removals:
                log.info("gc: removed %d things, %s", len(report.removals), human(report.bytes))
