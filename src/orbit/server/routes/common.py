"""What every /api/v1 router shares: the caller a route acts for (`me`), the check that refuses
what no store keeps as sent (`storable`), the problems a route may answer, the base of every
request body, and a run's reference."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field

from orbit.model.auth import UserRecord
from orbit.model.errors import Forbidden, OrbitError
from orbit.server.auth import Caller
from orbit.server.config import ServerConfig
from orbit.server.permissions import AGENT, API, CONSOLE, OPEN, route_of
from orbit.server.problems import responses

RUN_REF = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def caller(request: Request) -> Caller:
    """The request's user and token (found by auth.RequireToken before the body was read),
    and the service that will act for them."""
    made: Caller | None = getattr(request.state, "caller", None)
    if made is None:  # once a request: the gate's and the route's are the same caller
        user: UserRecord = request.state.user
        config: ServerConfig = request.app.state.config
        state = request.app.state
        made = Caller(user, state.service, request.state.token, config.local_roles, state.roles)
        request.state.caller = made
    return made


me = Annotated[Caller, Depends(caller)]


def api_gate(request: Request) -> None:
    """The permission of the API route asked (orbit.server.permissions.API), held or 403."""
    from orbit.server.openapi import operation_id

    check(request, API, operation_id(route_of(request)))


class ConsoleRefused(OrbitError):
    """A console page's gate refused it (403, or 404 for a run not to be seen): shown as the
    console's error page (ui.install_console), with the status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def console_gate(request: Request) -> None:
    """The permission of the console route asked (orbit.server.permissions.CONSOLE)."""
    from orbit.server.problems import status_of

    try:
        check(request, CONSOLE, route_of(request).name)
    except OrbitError as exc:
        raise ConsoleRefused(status_of(exc), str(exc)) from None


def check(request: Request, table: dict[str, str], key: str) -> None:
    """Refuse the caller (403) unless their role holds the permission `table` names for the
    route asked (by `key`); a route no table names is closed to everyone."""
    needed = table.get(key)
    if needed is None:
        raise Forbidden(f"no permission is declared for {key!r}, so it is closed to everyone")
    if needed in (OPEN, AGENT):
        return
    who = caller(request)
    who.require(needed)
    ref = request.path_params.get("ref")
    if ref is not None and "/runs/{ref}" in route_of(request).path:
        run = who.see_run(ref)  # a restricted experiment's run is not there for a non-member
        if needed.endswith(".own"):  # X.own: the caller's own run, or X.any
            who.require_run(run, needed.removesuffix(".own"))


NUL = "must not contain NUL (\\x00)"
NOT_FINITE = "must be a finite number"
Loc = tuple[str | int, ...]


def unstorable(value: Any) -> tuple[Loc, str] | None:
    """Where in a JSON value is something no store keeps as it was sent, and why: a NUL in a
    text or key (PostgreSQL refuses it, SQLite keeps it), or a number too large to be finite
    (1e400, or Python's Infinity and NaN: JSON has none, PostgreSQL refuses them)."""
    stack: list[tuple[Loc, Any]] = [((), value)]
    while stack:  # not recursive: a body may nest as deep as JSON parsers allow
        loc, item = stack.pop()
        if isinstance(item, str) and "\x00" in item:
            return loc, NUL
        if isinstance(item, float) and not math.isfinite(item):
            return loc, NOT_FINITE
        if isinstance(item, dict):
            for key, sub in item.items():
                if "\x00" in key:
                    return (*loc, _shown(key)), NUL
                stack.append(((*loc, key), sub))
        elif isinstance(item, list):
            stack.extend(((*loc, index), sub) for index, sub in enumerate(item))
    return None


def _shown(name: str) -> str:
    return name.replace("\x00", "\\x00")


async def storable(request: Request, who: me) -> None:
    """Refuse, naming the field, a path, query or JSON body that holds what no store keeps
    as sent (see `unstorable`): every store then answers alike, with a 422 rather than
    PostgreSQL's 503. After `who`: a caller without a token hears 401 first."""
    params = [("path", k, v) for k, v in request.path_params.items()]
    params += [("query", k, v) for k, v in request.query_params.multi_items()]
    found: tuple[Loc, str] | None = next(
        (((kind, _shown(k)), NUL) for kind, k, v in params if "\x00" in k + v), None
    )
    content_type = request.headers.get("content-type", "")
    if found is None and request.method != "GET" and "form" not in content_type:
        try:
            in_body = unstorable(json.loads(await request.body() or b"null"))
        except (ValueError, RecursionError):
            return  # not JSON: FastAPI says what is wrong with it
        found = None if in_body is None else (("body", *in_body[0]), in_body[1])
    if found is not None:
        raise RequestValidationError([{"type": "unstorable", "loc": found[0], "msg": found[1]}])


def api_router() -> APIRouter:
    """An /api/v1 router: its routes answer problems, and refuse what no store keeps."""
    return APIRouter(
        prefix="/api/v1",
        responses=responses("a problem (RFC 9457)", 400, 401, 403, 404, 409, 422, 502),
        dependencies=[Depends(storable), Depends(api_gate)],
    )


# a row number of the store (a 32-bit integer column): larger is no row, said as a 422
RowId = Annotated[int, Path(ge=1, le=2**31 - 1)]
