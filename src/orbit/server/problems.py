"""Errors as HTTP answers: problem details (RFC 9457) whose `detail` is the one line the CLI
prints, and whose `error` names ORBIT's error class, so a client raises the very error the
service raised and the CLI exits with the same code and says the same thing. No answer shows
where the server keeps its files: a path under them is said as "(a path on the server)", and
the full text goes to the server's log."""

from __future__ import annotations

import errno
import logging
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from orbit.model.errors import (
    Forbidden,
    InvalidInput,
    NoBackend,
    NotFound,
    OrbitError,
    Refused,
    ServerError,
    StoreError,
    Unauthorized,
    Unreachable,
    pydantic_location,
)

if TYPE_CHECKING:
    from orbit.model.config import Settings

log = logging.getLogger("orbit.server")

PROBLEM = "application/problem+json"
STATUS: dict[type[OrbitError], int] = {
    InvalidInput: 422,
    NoBackend: 422,
    NotFound: 404,
    Refused: 409,
    Unauthorized: 401,
    Forbidden: 403,
    Unreachable: 502,  # a host behind the server did not answer: not the client's mistake
    ServerError: 500,  # the server's own failure (a disk it writes to): nobody's input
}
TITLES = {
    400: "Bad request",
    401: "Not signed in",
    403: "Not allowed",
    404: "Not found",
    405: "Method not allowed",
    409: "Refused",
    413: "Too large",
    422: "Invalid input",
    429: "Too many requests",
    500: "Server error",
    502: "Host unreachable",
    503: "Store unavailable",
    507: "Disk full",
}
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
STORE_RETRY_AFTER_S = 2  # a 503 for a store that failed: try again no sooner than this
SERVER_PATH = "(a path on the server)"
# the server's own folders, as a pattern that finds a path under them (install sets it)
_hidden: re.Pattern[str] | None = None
# what FastAPI says of a JSON body that json.loads refused with other than a JSONDecodeError
UNPARSED = "There was an error parsing the body"
# what an answer's body may hold, for the OpenAPI document
PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "title", "status", "detail", "error"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "error": {"type": "string"},
        "field": {"type": "string"},
    },
}


# how the OpenAPI document names that body: once, as a component (server/openapi.py)
PROBLEM_CONTENT: dict[str, Any] = {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}}


def responses(description: str, *codes: int) -> dict[int | str, dict[str, Any]]:
    """The problems a router's routes may answer, for the OpenAPI document."""
    return {code: {"description": description, "content": PROBLEM_CONTENT} for code in codes}


def internal_paths(settings: Settings) -> list[str]:
    """Where the server keeps what no client needs to know the place of: $ORBIT_HOME, the
    SQLite store's file, and the scratch folders of uploads."""
    from orbit.store.drivers import sqlite_path

    places = [settings.home, Path(tempfile.gettempdir()) / "orbit-inputs-"]
    store = sqlite_path(settings.database_url)
    if store is not None:
        places.append(store.absolute())
    found = {str(p) for p in places} | {str(p.resolve()) for p in places}
    return sorted(found, key=len, reverse=True)


def hide_paths(roots: Iterable[str]) -> None:
    """From now on, a path under one of `roots` in a problem's detail is not shown."""
    global _hidden
    names = [re.escape(r.rstrip("/")) for r in roots if r.strip("/")]
    _hidden = re.compile(rf"(?:{'|'.join(names)})[^\s'\"]*") if names else None


def hidden(detail: str) -> str:
    return detail if _hidden is None else _hidden.sub(SERVER_PATH, detail)


def problem(
    status: int,
    detail: str,
    error: str,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body = {
        "type": "about:blank",
        "title": TITLES.get(status, "Error"),
        "status": status,
        "detail": hidden(detail),
        "error": error,
        **extra,
    }
    if status == 401:
        headers = {"WWW-Authenticate": "Bearer", **(headers or {})}
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def store_failed(exc: StoreError) -> JSONResponse:
    """503: the server's own store failed (not the client's doing), logged once."""
    log.error("the store failed: %s", exc.first_line)
    detail = f"the server's store failed: {exc.first_line}"
    # clients and agents wait at least this long (and jitter on top) before trying again
    return problem(503, detail, "ServerError", headers={"Retry-After": str(STORE_RETRY_AFTER_S)})


def status_of(exc: OrbitError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 400


def install(app: FastAPI, internal: Iterable[str] = ()) -> None:
    """The handlers that turn every error into a problem; `internal`: the server's own
    folders, never shown (see internal_paths)."""
    hide_paths(internal)

    @app.exception_handler(OrbitError)
    async def orbit_error(request: Request, exc: OrbitError) -> JSONResponse:
        return problem(status_of(exc), str(exc), type(exc).__name__)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first: dict[str, Any] = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        loc = tuple(first.get("loc", ()))
        if loc and loc[0] in ("body", "query", "path", "header"):
            loc = loc[1:]
        if first.get("type") == "json_invalid":  # FastAPI's: loc is ("body", character)
            where = f" at character {loc[0]}" if loc else ""
            why = (first.get("ctx") or {}).get("error", "JSON decode error")
            detail = f"body: not valid JSON ({why}{where})"
            return problem(400, detail, "InvalidInput", field="body")
        field = pydantic_location(loc)
        message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        if first.get("type") == "extra_forbidden":
            message = "unknown field"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return problem(422, f"{field}: {message}{more}", "InvalidInput", field=field)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        status = exc.status_code
        detail = exc.detail if isinstance(exc.detail, str) else TITLES.get(status, "error")
        if status == 400:  # FastAPI or Starlette could not parse the body (JSON, multipart)
            if detail == UNPARSED:  # not UTF-8, nested too deep...: the cause says which
                detail = f"not valid JSON ({exc.__cause__ or 'unreadable'})"
            return problem(400, f"body: {detail.rstrip('.')}", "InvalidInput", field="body")
        error = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound"}.get(status)
        return problem(status, detail, error or ("InvalidInput" if status < 500 else "ServerError"))

    @app.exception_handler(StoreError)
    async def store_down(request: Request, exc: StoreError) -> JSONResponse:
        return store_failed(exc)

    @app.exception_handler(OSError)
    async def os_error(request: Request, exc: OSError) -> JSONResponse:
        """The server's own disk failed it: said without the file's name (logged in full)."""
        log.error("%s %s failed: %s", request.method, request.url.path, exc)
        if exc.errno in DISK_FULL:
            why = "the server is out of disk space: its admin must free some"
            return problem(507, why, "ServerError")
        return problem(
            500, f"the server failed: {exc.strerror or type(exc).__name__}", "ServerError"
        )

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return problem(500, f"the server failed: {type(exc).__name__}: {exc}", "ServerError")
