"""The server's alerts loop: every `alerts.every_s` the conditions (conditions.py) are looked
at over what the store says now, the store raises what newly holds and resolves what no longer
does (one open alert per key, whichever replica looks), and what this replica changed is
delivered (deliver.py)."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

from orbit.core.control.service import CoreControlService
from orbit.model.alerts import AlertsConfig, Firing
from orbit.server.alerts.conditions import node_alerts, run_alerts
from orbit.server.alerts.deliver import Deliverer

log = logging.getLogger("orbit.server.alerts")


class AlertLoop:
    def __init__(self, service: CoreControlService, config: AlertsConfig, offline_s: float) -> None:
        self.service = service
        self.config = config
        self.offline_s = offline_s
        self.deliver = Deliverer(config.webhooks, config.tries)
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
        store = self.service.store
        before = now - timedelta(seconds=self.config.run_waiting_s)
        return [
            *node_alerts(store.nodes.list_nodes(), now, self.offline_s),
            *run_alerts(
                store.alerts.waiting_runs(before),
                store.alerts.retried_runs(self.config.retries_over),
                now,
                self.config,
            ),
        ]

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
