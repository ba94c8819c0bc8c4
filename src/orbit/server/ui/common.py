"""What every console page shares: the caller's context for the templates (who, which buttons
their role gets, the CSRF token), the error page a missing run or a bad query answers with, and
query values read by hand, so that a wrong one is a line on the page, never a 422 or a 500."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import wraps
from typing import Any, ParamSpec

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from orbit.model.errors import Forbidden, InvalidInput, NotFound, OrbitError
from orbit.server.auth import Caller
from orbit.server.routes.common import console_gate
from orbit.server.ui.render import page
from orbit.server.ui.session import PREFIX, notice_of

P = ParamSpec("P")
NAV = (
    ("overview", "/ui/", "Overview"),
    ("runs", "/ui/runs", "Runs"),
    ("queue", "/ui/queue", "Queue"),
    ("nodes", "/ui/nodes", "Nodes"),
    ("fair-share", "/ui/fair-share", "Fair share"),
    ("alerts", "/ui/alerts", "Alerts"),
    ("audit", "/ui/audit", "Audit"),
    ("admin", "/ui/admin", "Admin"),
)


class BadQuery(InvalidInput):
    """A query parameter the page cannot use: said on the page, which shows without it."""


def console_router() -> APIRouter:
    return APIRouter(prefix=PREFIX, include_in_schema=False, dependencies=[Depends(console_gate)])


def context(request: Request, who: Caller, section: str, **values: Any) -> dict[str, Any]:
    """The values every page's template reads, and the page's own."""
    return {
        "me": who.user,
        "may": who.may,  # whether the user's role holds a permission
        "csrf": getattr(request.state, "csrf", None) or "",
        "nav": NAV,
        "section": section,
        "notice": notice_of(request),
        **values,
    }


def error_page(request: Request, who: Caller | None, status: int, message: str) -> Response:
    values: dict[str, Any] = {"status": status, "message": message, "nav": NAV, "section": ""}
    if who is not None:
        values = context(request, who, "", status=status, message=message)
    return page("error.html", status, **values)


STATUS = {NotFound: 404, Forbidden: 403, InvalidInput: 400}


def status_of(exc: OrbitError) -> int:
    """The status an ORBIT error answers with, as on the API (502: the execution plane's)."""
    return next((s for kind, s in STATUS.items() if isinstance(exc, kind)), 502)


def guarded(fn: Callable[P, Response]) -> Callable[P, Response]:
    """A page whose ORBIT error (an unknown run, a refusal, a bad value) is the error page
    with its status and one line, not a problem document or a 500."""

    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Response:
        try:
            return fn(*args, **kwargs)
        except OrbitError as exc:
            request, who = kwargs["request"], kwargs.get("who")
            return error_page(request, who, status_of(exc), str(exc))  # type: ignore[arg-type]

    return wrapper


def whole(value: str | None, name: str, *, default: int, low: int = 1, high: int = 1000) -> int:
    if value is None or value == "":
        return default
    if not re.fullmatch(r"[0-9]{1,18}", value) or not low <= int(value) <= high:
        raise BadQuery(f"{name} must be a whole number from {low} to {high}, not '{value}'")
    return int(value)


def choice(value: str | None, name: str, allowed: Any) -> str | None:
    """One of `allowed` (an Enum or strings), or None for nothing given."""
    if not value:
        return None
    names = [getattr(a, "value", a) for a in allowed]
    if value not in names:
        raise BadQuery(f"{name} must be one of {', '.join(names)}, not '{value}'")
    return value


# a file of a run's is shown or downloaded as data, never run as a page of this origin
FILE_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "sandbox; default-src 'none'",
    "Cache-Control": "private, no-store",
}


def attachment(name: str) -> str:
    """A Content-Disposition that downloads as `name`, whatever its characters (RFC 6266)."""
    from urllib.parse import quote

    plain = "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in name)
    return f"attachment; filename=\"{plain}\"; filename*=UTF-8''{quote(name, safe='')}"
