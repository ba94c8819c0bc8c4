"""Spans of time as people write and read them (`30d`, `12h`, `95s`): parsed for flags and
settings, said for tables and alerts. The standard library only, so that the CLI's commands
that print a span import nothing heavier at start."""

from __future__ import annotations

import re
from datetime import timedelta

from orbit.model.errors import InvalidInput

_DURATION = re.compile(r"([0-9]+)([smhdw])")
MAX_DURATION = timedelta(days=100 * 365)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str, field: str) -> timedelta:
    """`30d`, `12h`, `45m`, `3600s` or `2w`: more than nothing, and at most MAX_DURATION (so
    that now + it is still a date)."""
    found = _DURATION.fullmatch(text.strip())
    if found:
        seconds = int(found.group(1)) * _UNIT_SECONDS[found.group(2)]
        if 0 < seconds <= MAX_DURATION.total_seconds():
            return timedelta(seconds=seconds)
    raise InvalidInput(f"{field}: expected a duration like 30d, 12h or 45m, got {text!r}")


def say_duration(seconds: float) -> str:
    """A span as a person reads it at a glance: `95s`, `12m`, `1.5h`."""
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
