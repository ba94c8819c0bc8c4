"""/metrics: Prometheus text. Runs by state (counted when scraped), submissions, the API's
latency by route (the route's template, never a run id), and how late the reconcile loop is."""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orbit.core.states import RunState
from orbit.store import Store

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class RunsByState(Collector):
    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("orbit_runs", "Runs in the store, by state.", labels=["state"])
        for state in RunState:
            family.add_metric([state.value], self.store.count_runs(states={state}))
        yield family


class Metrics:
    def __init__(self, store: Store) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(RunsByState(store))
        self.submissions = Counter(
            "orbit_submissions",
            "Submissions received, by outcome (accepted or refused).",
            ["outcome"],
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
