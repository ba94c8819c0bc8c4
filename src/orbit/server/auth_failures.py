"""Failed authentications: counted in /metrics by kind and reason, logged without the credential
(the source address, the route's template, why), and limited per source address. After a burst
of failures from one address, every request from it is answered 429 with Retry-After for a
while, before anything reads the store; other addresses are not touched. The limiter remembers
a bounded number of addresses, so a flood of them cannot grow the server's memory."""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import Counter
from starlette.routing import BaseRoute, Match
from starlette.types import Scope

from orbit.model.errors import Unauthorized
from orbit.server.config import AuthFailures
from orbit.server.metrics import Metrics

log = logging.getLogger("orbit.server.auth")

# why a credential was refused, as /metrics and the log name it
MISSING, MALFORMED, UNKNOWN, REVOKED, EXPIRED = (
    "missing",
    "malformed",
    "unknown",
    "revoked",
    "expired",
)
# what a missing credential says is not a guess: it is counted and logged, never limited
NOT_GUESSES = frozenset({MISSING})


class AuthFailed(Unauthorized):
    """A credential refused, and why: the reason goes to /metrics and the log, while the
    client hears only the message (which does not tell an unknown token from a revoked one)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(slots=True)
class _Source:
    count: int  # failures since `since`
    since: float  # when this window of failures began
    until: float  # refused until then (0: not refused)


class FailureLimiter:
    """Per source: `burst` failures within `window_s` refuse it for `block_s`. At most
    `sources` sources are kept; the one whose last failure is oldest goes first. Used from the
    server's event loop only, so it needs no lock."""

    def __init__(self, config: AuthFailures, clock: Callable[[], float] = time.monotonic) -> None:
        self.config, self.clock = config, clock
        self._seen: OrderedDict[str, _Source] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def retry_after(self, source: str) -> float | None:
        """Seconds until `source` may be heard again; None: now."""
        entry = self._seen.get(source)
        if entry is None:
            return None
        left = entry.until - self.clock()
        return left if left > 0 else None

    def failed(self, source: str) -> bool:
        """Count one failure of `source`; True when it is the one that starts a block."""
        now = self.clock()
        entry = self._seen.pop(source, None)
        if entry is None or now - entry.since > self.config.window_s or 0 < entry.until <= now:
            entry = _Source(count=0, since=now, until=0.0)
        entry.count += 1
        started = entry.count >= self.config.burst and entry.until == 0.0
        if started:
            entry.until = now + self.config.block_s
        self._seen[source] = entry  # the most recent failure last
        while len(self._seen) > self.config.sources:
            self._seen.popitem(last=False)
        return started


def source_of(scope: Scope) -> str:
    """The caller's address (uvicorn has put a trusted proxy's X-Forwarded-For there); an IPv6
    address by its /64, which one machine commonly holds whole."""
    client = scope.get("client")
    host = str(client[0]) if client else "unknown"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def flat(routes: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    """The routes of an app, those of the routers it includes one by one (FastAPI keeps an
    included router whole, and its match says nothing of which of its routes matched)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from flat(inner.routes)
        else:
            yield route


def route_of(scope: Scope, routes: Iterable[BaseRoute]) -> str:
    """The template of the route the request is for (never its path: no ids in logs)."""
    partial = None
    for route in flat(routes):
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return str(getattr(route, "path", "unmatched"))
        if match is Match.PARTIAL and partial is None:
            partial = str(getattr(route, "path", "unmatched"))
    return partial or "unmatched"


class AuthGuard:
    """The limiter, the counters and the log line, for the middleware that authenticates."""

    def __init__(self, config: AuthFailures, metrics: Metrics, routes: Sequence[BaseRoute]) -> None:
        self.limiter = FailureLimiter(config)
        self.routes = routes
        self.failures = Counter(
            "orbit_auth_failures",
            "Failed authentications, by credential (user, node) and reason.",
            ["kind", "reason"],
            registry=metrics.registry,
        )
        self.limited = Counter(
            "orbit_auth_limited_requests",
            "Requests answered 429: their source failed to authenticate too often.",
            registry=metrics.registry,
        )

    def retry_after(self, scope: Scope) -> int | None:
        """Whole seconds the request's source must wait, counted; None: it may go on."""
        left = self.limiter.retry_after(source_of(scope))
        if left is None:
            return None
        self.limited.inc()
        return max(1, math.ceil(left))

    def failed(self, scope: Scope, kind: str, reason: str) -> None:
        """Count, log (no credential in it) and, for a guess, limit one failure."""
        source = source_of(scope)
        self.failures.labels(kind, reason).inc()
        route = route_of(scope, self.routes)
        level = logging.INFO if reason in NOT_GUESSES else logging.WARNING
        log.log(
            level,
            "authentication failed: %s credential %s, from %s, %s %s",
            kind,
            reason,
            source,
            scope.get("method", "-"),
            route,
        )
        if reason not in NOT_GUESSES and self.limiter.failed(source):
            config = self.limiter.config
            log.warning(
                "refusing every request from %s for %.0f s: %d failed authentications within "
                "%.0f s (server setting auth_failures)",
                source,
                config.block_s,
                config.burst,
                config.window_s,
            )
