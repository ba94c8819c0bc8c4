"""/metrics: Prometheus text. Runs by state (counted when scraped), submissions, the API's
latency by route (the route's template, never a run id), how late the reconcile loop is, and
the bytes stored by user and experiment; the process, the build, nodes, GPUs and the queue
(fleet_metrics)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orbit.core.control.sched_config import LiveSchedConfig
from orbit.model.states import RunState
from orbit.model.storage import Usage
from orbit.server.fleet_metrics import FleetMetrics
from orbit.store import Store

if TYPE_CHECKING:
    from orbit.server.input_sets import Received

USAGE_EVERY_S = 30.0  # a scrape at most this often walks the storage (settled copies: once)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class RunsByState(Collector):
    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("orbit_runs", "Runs in the store, by state.", labels=["state"])
        for state in RunState:
            family.add_metric([state.value], self.store.runs.count_runs(states={state}))
        yield family


class OpenAlerts(Collector):
    """The server's own alerts open now, by kind and severity: every condition of `orbit
    alerts list` as a series Alertmanager can match (orbit alerts rules)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "orbit_alerts_open",
            "The server's alerts open now, by kind and severity.",
            labels=["kind", "severity"],
        )
        counts: dict[tuple[str, str], int] = {}
        for alert in self.store.alerts.list_alerts():
            key = (alert.kind, alert.severity)
            counts[key] = counts.get(key, 0) + 1
        for (kind, severity), count in sorted(counts.items()):
            family.add_metric([kind, severity], count)
        yield family


class SchedConfigState(Collector):
    """1 while the scheduler config file holds a config that was refused (the last good one
    is live): the alert to set on it."""

    def __init__(self, watch: LiveSchedConfig) -> None:
        self.watch = watch

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with contextlib.suppress(Exception):  # a look at the file now, as a pass makes
            self.watch.live()
        yield GaugeMetricFamily(
            "orbit_scheduler_config_invalid",
            "1 while the scheduler config file holds a refused config (the last good is live).",
            value=1.0 if self.watch.error is not None else 0.0,
        )


class StorageUsage(Collector):
    """Bytes on the control plane by user and experiment (orbit.core.control.usage), counted
    when scraped, at most every USAGE_EVERY_S (the same figures as `orbit usage`)."""

    def __init__(self, usage: Callable[[], Usage]) -> None:
        self.usage = usage
        self._last: tuple[float, Usage] | None = None
        self._lock = threading.Lock()

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The families without samples: registering counts nothing."""
        yield from (self._family(label) for label in ("user", "experiment"))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        found = self._fresh()
        for label, rows in (("user", found.users), ("experiment", found.experiments)):
            family = self._family(label)
            for row in rows:
                family.add_metric([row.name, "artifacts"], row.artifacts_bytes)
                family.add_metric([row.name, "bundles"], row.bundles_bytes)
            yield family

    @staticmethod
    def _family(label: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            f"orbit_storage_{label}_bytes",
            f"Bytes on the control plane by {label}: artifacts (attempts' copies) and bundles.",
            labels=[label, "kind"],
        )

    def _fresh(self) -> Usage:
        with self._lock:
            if self._last is None or time.monotonic() - self._last[0] >= USAGE_EVERY_S:
                self._last = (time.monotonic(), self.usage())
            return self._last[1]


class Metrics:
    def __init__(self, store: Store) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(RunsByState(store))
        self.fleet = FleetMetrics(self.registry, store)
        self.submissions = Counter(
            "orbit_submissions",
            "Submissions received, by outcome (accepted or refused).",
            ["outcome"],
            registry=self.registry,
        )
        self.inputs_bytes = Counter(
            "orbit_inputs_received_bytes",
            "Bytes of submissions' inputs received (archives, as sent).",
            registry=self.registry,
        )
        self.inputs_reused = Counter(
            "orbit_inputs_reused",
            "Submissions whose inputs the server held already (named by digest, not sent).",
            registry=self.registry,
        )
        self.requests = Histogram(
            "orbit_http_request_duration_seconds",
            "Time to answer an API request, by route template, method and status class.",
            ["method", "route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.loop_lag = Gauge(
            "orbit_reconcile_lag_seconds",
            "How late the reconcile loop's last pass started against its schedule.",
            registry=self.registry,
        )
        self.loop_pass = Histogram(
            "orbit_reconcile_pass_seconds",
            "Time one reconcile pass took.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.reconciled = Counter(
            "orbit_reconciled_attempts",
            "Active attempts looked at by the reconcile loop.",
            registry=self.registry,
        )
        self.loop_errors = Counter(
            "orbit_reconcile_errors",
            "Looks at an attempt that failed (the next pass tries again).",
            registry=self.registry,
        )

    def count_inputs(self, received: Received) -> None:
        self.inputs_bytes.inc(received.sent_bytes)
        if received.reused:
            self.inputs_reused.inc()

    def asgi(self, app: ASGIApp) -> ASGIApp:
        """Wrap `app`: time each HTTP request to its answer's start, labelled by route."""

        async def timed(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            start = time.perf_counter()
            status = 500

            async def sending(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                    route = getattr(scope.get("route"), "path", "unmatched")
                    self.requests.labels(scope["method"], route, f"{status // 100}xx").observe(
                        time.perf_counter() - start
                    )
                await send(message)

            await app(scope, receive, sending)

        return timed
