"""How long to wait before trying again: capped exponential backoff with full jitter (each wait
drawn uniformly from 0 to min(cap, base * 2**failures), as in AWS's "Exponential Backoff And
Jitter"), and a server's Retry-After honoured as the least wait. Every loop that talks to a
server again after a failure waits this way: 200 agents that lost their server in the same
instant must not all come back in the same instant too.

Pure: the randomness is a function the caller may pass (tests pass a seeded one)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

RETRY_AFTER_MAX_S = 3600.0  # a server asking more than this is taken as asking this much


def full_jitter(
    failures: int, base_s: float, cap_s: float, rand: Callable[[], float] = random.random
) -> float:
    """A wait after `failures` failures in a row (0: the first retry)."""
    return rand() * min(cap_s, base_s * float(2 ** min(failures, 62)))


def retry_after(headers: Mapping[str, str] | None, now: datetime | None = None) -> float | None:
    """The seconds a Retry-After header asks for (delay-seconds or an HTTP-date), None when
    there is none or it cannot be read."""
    value = (headers or {}).get("retry-after") or (headers or {}).get("Retry-After")
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), RETRY_AFTER_MAX_S)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_S)


@dataclass
class Backoff:
    """One loop's waits: `next()` after each failure, `reset()` after a success."""

    base_s: float = 0.2
    cap_s: float = 5.0
    rand: Callable[[], float] = field(default=random.random, repr=False)
    failures: int = 0

    def next(self, asked_s: float | None = None) -> float:
        """The wait now: the jittered one, on top of what the server asked for, if it did
        (so that those it told the same thing do not come back together either)."""
        wait = full_jitter(self.failures, self.base_s, self.cap_s, self.rand)
        self.failures += 1
        return wait + asked_s if asked_s is not None else wait

    def reset(self) -> None:
        self.failures = 0


def follow_waits() -> Backoff:
    """A log follow's waits between tries after a break (the client's stream cut, or the
    run's host away): 0.2 s growing to 4 s, a mean of about 2 s once grown."""
    return Backoff(base_s=0.2, cap_s=4.0)
