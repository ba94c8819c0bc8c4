"""The console's pages as HTML: one Jinja2 environment over templates/, escaping everything it
is given (a log line, a label, a file name from a run shows as text), and the filters that
make values readable (times relative with the absolute on hover, sizes and durations human,
states in colour and in words)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from functools import cache
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.responses import HTMLResponse

# a state's colour class: going, waiting, good, bad, stopped
TONE = {
    "prepared": "wait",
    "submitted": "wait",
    "provisioning": "go",
    "starting": "go",
    "running": "go",
    "succeeded": "good",
    "failed": "bad",
    "terminated": "stop",
}


def ago(when: datetime | None, now: datetime | None = None) -> Markup:
    """`3 min ago`, with the exact time (UTC) on hover; an em dash for none."""
    if when is None:
        return Markup("&mdash;")
    now = now or datetime.now(UTC)
    seconds = (now - when).total_seconds()
    words = f"{duration(abs(seconds))} ago" if seconds >= 0 else f"in {duration(-seconds)}"
    exact = when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return Markup('<time datetime="{}" title="{}">{}</time>').format(when.isoformat(), exact, words)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds and minutes < 10 else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{hours // 24} d {hours % 24} h"


def matches(total: int, cap: int = 1000) -> str:
    """A listing's count as counted: `1,234`, or `more than 1,000` where it stopped."""
    return f"more than {cap:,}" if total > cap else f"{total:,}"


def size(count: float | None) -> str:
    if count is None:
        return "—"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def state(value: Any) -> Markup:
    """A state as a coloured badge that also says it in words."""
    text = str(getattr(value, "value", value))
    return Markup('<span class="state {}">{}</span>').format(TONE.get(text, "other"), text)


def pretty(value: Any) -> str:
    return json.dumps(value, default=str, indent=2, sort_keys=True)


@cache
def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("orbit.server.ui", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        ago=ago,
        duration=duration,
        size=size,
        state=state,
        pretty=pretty,
        matches=matches,
    )
    return env


# every page: its own scripts and styles only, in no frame, and no referrer beyond this server
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
        "form-action 'self'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "private, no-cache",
}


def page(name: str, code: int = 200, **values: Any) -> HTMLResponse:
    """The template `name` rendered with `values`, answered with status `code`."""
    html = environment().get_template(name).render(**values)
    return HTMLResponse(html, status_code=code, headers=PAGE_HEADERS)
