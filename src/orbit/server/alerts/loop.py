"""The server's alerts loop: every `alerts.every_s` the conditions (conditions.py) are looked
at over what the store says now, the store raises what newly holds and resolves what no longer
does (one open alert per key, whichever replica looks), and what this replica changed is
delivered (deliver.py). Two need memory of their own: since when each running run's progress
has not moved (this replica's, from its first look), and the audit chain's last check (walked
every `audit_every_s`, not every pass)."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

from orbit.core.control.service import CoreControlService
from orbit.model.alerts import AlertsConfig, Firing
from orbit.model.models import RunState
from orbit.server.alerts.conditions import (
    audit_alerts,
    node_alerts,
    run_alerts,
    stalled_alerts,
    starvation_alerts,
)
from orbit.server.alerts.deliver import Deliverer

log = logging.getLogger("orbit.server.alerts")
NEAR = ("agent_pool", "local")  # backends whose runs' files the server reads on its own disk
WATCHED = 200  # the most running runs whose progress one pass reads
ACTIVE = {RunState.PROVISIONING, RunState.STARTING, RunState.RUNNING}


class AlertLoop:
    def __init__(self, service: CoreControlService, config: AlertsConfig, offline_s: float) -> None:
        self.service = service
        self.config = config
        self.offline_s = offline_s
        self.deliver = Deliverer(config.webhooks, config.tries)
        # run -> (what its progress was, since when): a run whose progress does not move
        self._moved: dict[str, tuple[tuple[object, ...], datetime]] = {}
        self._audit: tuple[datetime, list[str]] | None = None  # the last check, its problems
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="alerts", daemon=True)

    def start(self) -> None:
        self.deliver.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.deliver.stop()

    def firing(self, now: datetime) -> list[Firing]:
        store, config = self.service.store, self.config
        before = now - timedelta(seconds=config.run_waiting_s)
        starved = store.alerts.waiting_runs(now - timedelta(seconds=config.starved_s))
        return [
            *node_alerts(store.nodes.list_nodes(), now, self.offline_s, config),
            *run_alerts(
                store.alerts.waiting_runs(before),
                store.alerts.retried_runs(config.retries_over),
                now,
                config,
            ),
            *stalled_alerts(self._stalled(now), now, config),
            *starvation_alerts(starved, *self._shares(bool(starved)), now, config),
            *audit_alerts(self._audit_problems(now)),
        ]

    def _stalled(self, now: datetime) -> list[tuple[str, str, int | None, datetime]]:
        """(run, user, step, since) of each running run that logs progress, with since when
        its newest progress has been what it is."""
        runs = self.service.store.runs.list_runs(states={RunState.RUNNING}, limit=WATCHED)
        moved: dict[str, tuple[tuple[object, ...], datetime]] = {}
        found = []
        for run in runs:
            if not run.current.backend_key.startswith(NEAR):
                continue
            try:
                progress = self.service.progress(run)
            except Exception:  # one run's files unreadable: the others are still looked at
                log.exception("the progress of %s could not be read", run.id)
                continue
            if progress is None:  # it logs none (yet): nothing to judge it by
                continue
            now_at = (progress.file, progress.step, progress.loss, progress.epoch)
            was, since = self._moved.get(run.id, (None, now))
            moved[run.id] = (now_at, since if was == now_at else now)
            found.append((run.id, run.created_by, progress.step, moved[run.id][1]))
        self._moved = moved  # runs no longer running are forgotten
        return found

    def _shares(self, needed: bool) -> tuple[dict[str, int], dict[str, int]]:
        """The GPUs each user holds now, and each user's quota (read only when a run waits)."""
        from orbit.scheduler.gpu_hours import gpus_of

        if not needed:
            return {}, {}
        store, held = self.service.store, dict[str, int]()
        for user, _, request in store.runs.holding(ACTIVE):
            held[user] = held.get(user, 0) + gpus_of(request if isinstance(request, dict) else {})
        quotas = {
            str(q["name"]): int(q["gpus"])
            for q in store.scheduling.list_quotas()
            if q["scope"] == "user"
        }
        return held, quotas

    def _audit_problems(self, now: datetime) -> list[str]:
        """The audit chain's problems as of its last check, walked again when it is due."""
        due = self._audit is None or now - self._audit[0] >= timedelta(
            seconds=self.config.audit_every_s
        )
        if due:
            self._audit = (now, list(self.service.verify_audit().problems))
        assert self._audit is not None
        return self._audit[1]

    def look(self) -> None:
        raised, resolved = self.service.store.alerts.sync(self.firing(datetime.now(UTC)))
        for alert in raised:
            log.warning("alert %s raised: %s", alert.id, alert.message)
            self.deliver.send("raised", alert)
        for alert in resolved:
            log.info("alert %s resolved: %s", alert.id, alert.message)
            self.deliver.send("resolved", alert)

    def _run(self) -> None:
        while not self._stop.wait(self.config.every_s):
            try:
                self.look()
            except Exception:  # the store is away, say: the next look tries again
                log.exception("an alerts pass failed")
