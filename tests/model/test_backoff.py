"""Backoff as the loops that talk to a server use it: each wait drawn from 0 up to a window
that doubles from the base to the cap (full jitter), a server's Retry-After (seconds or an
HTTP-date) the least wait, and a success starting the window over."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

from orbit.model.backoff import Backoff, full_jitter, retry_after


def test_the_window_doubles_to_the_cap_and_each_wait_is_drawn_inside_it() -> None:
    assert [full_jitter(n, 0.2, 5.0, lambda: 1.0) for n in range(7)] == [
        0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0,
    ]  # fmt: skip
    assert full_jitter(10_000, 0.2, 5.0, lambda: 1.0) == 5.0  # no overflow, however long
    waits = Backoff(base_s=0.2, cap_s=5.0, rand=random.Random(7).random)
    drawn = [waits.next() for _ in range(200)]
    assert all(0.0 <= w <= 5.0 for w in drawn)
    late = drawn[10:]  # the window at its cap: spread over it, not bunched at one value
    assert min(late) < 1.0 and max(late) > 4.0 and len({round(w, 3) for w in late}) > 150
    waits.reset()
    assert waits.next() <= 0.2


def test_what_the_server_asked_for_is_the_least_wait_with_jitter_on_top() -> None:
    waits = Backoff(base_s=0.2, cap_s=5.0, rand=lambda: 0.5)
    assert waits.next(3.0) == 3.1
    assert waits.next() == 0.2


def test_retry_after_is_read_in_both_forms_and_nonsense_is_none() -> None:
    now = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
    assert retry_after({"Retry-After": "7"}) == 7.0
    assert retry_after({"retry-after": "120"}) == 120.0
    when = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert retry_after({"Retry-After": when}, now=now) == 30.0
    past = format_datetime(now - timedelta(seconds=30), usegmt=True)
    assert retry_after({"Retry-After": past}, now=now) == 0.0
    assert retry_after({"Retry-After": "99999999"}) == 3600.0  # at most an hour
    for bad in ("soon", "-5", "1.5", ""):
        assert retry_after({"Retry-After": bad}) is None
    assert retry_after({}) is None and retry_after(None) is None
