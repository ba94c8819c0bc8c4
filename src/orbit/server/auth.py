"""Who is calling: the bearer token, looked up (by its hash) on every request, so that a revoked
or expired token is refused at once; and what that user's role allows."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial

import anyio
from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from orbit.agent.protocol import PREFIX as AGENT_PREFIX
from orbit.agent.protocol import REGISTER_PATH, VERSION_HEADER
from orbit.core.auth import Role, UserRecord, can, token_hash
from orbit.core.control.service import CoreControlService
from orbit.core.errors import Forbidden, StoreError, Unauthorized
from orbit.core.records import RunRecord

WHAT = {
    "submit": "submit runs",
    "control": "control this run (it is someone else's)",
    "admin": "do this (admins only)",
}


@dataclass(frozen=True)
class Caller:
    """The authenticated user of one request, and the service acting for them."""

    user: UserRecord
    service: CoreControlService

    @contextmanager
    def acting(self) -> Iterator[CoreControlService]:
        """The service, with every audit event of the block naming this user."""
        with self.service.acting_as(self.user.name):
            yield self.service

    def require(self, action: str, *, own: bool = True) -> None:
        if not can(self.user.role, action, own=own):
            why = WHAT.get(action, action)
            if action == "control" and self.user.role is Role.VIEWER:
                why = "control runs"
            raise Forbidden(f"{self.user.name} ({self.user.role.value}) may not {why}")

    def require_run(self, run: RunRecord) -> None:
        """Control of a run: its owner (a member or admin), or any admin."""
        self.require("control", own=run.created_by == self.user.name)

    @property
    def admin(self) -> bool:
        return self.user.role is Role.ADMIN


def authenticate(service: CoreControlService, request: Request) -> UserRecord:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise Unauthorized(
            "this server needs a token: set ORBIT_TOKEN or run `orbit login URL` "
            "(the first admin token is in the server's admin-token file)"
        )
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("the Authorization header must be `Bearer <token>`")
    found = service.store.authenticate(token_hash(token.strip()), datetime.now(UTC))
    if found is None:
        raise Unauthorized("the token was not accepted (unknown, revoked or expired)")
    return found[0]


class RequireToken:
    """Every request but /healthz shows a token the store accepts, checked before anything
    reads its body: a client without one is turned away at once (401), not after uploading
    and parsing, and learns nothing of the API from validation errors."""

    OPEN = frozenset({"/healthz"})

    def __init__(self, app: ASGIApp, service: CoreControlService) -> None:
        self.app, self.service = app, service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.OPEN:
            await self.app(scope, receive, send)
            return
        if scope["path"].startswith(AGENT_PREFIX):
            await self.agent(scope, receive, send)
            return
        who = partial(authenticate, self.service, Request(scope))
        if await self.identify(scope, receive, send, "user", who):
            await self.app(scope, receive, send)

    @staticmethod
    async def identify(
        scope: Scope, receive: Receive, send: Send, key: str, who: Callable[[], object]
    ) -> bool:
        """Who is calling, found by `who` (in a worker thread: it reads the store) and kept in
        the request's state under `key`; or the answer that refuses it (401, or 503 when the
        store fails), and False."""
        from orbit.server.problems import problem, store_failed

        try:
            found = await anyio.to_thread.run_sync(who)
        except Unauthorized as exc:
            await problem(401, str(exc), "Unauthorized")(scope, receive, send)
            return False
        except StoreError as exc:
            await store_failed(exc)(scope, receive, send)
            return False
        scope.setdefault("state", {})[key] = found
        return True

    async def agent(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An agent's request: its node credential (registering needs none: its join token
        is in the body), then its protocol version."""
        from orbit.server.agents import authenticate_node, other_version
        from orbit.server.problems import problem

        request = Request(scope)
        if scope["path"] != REGISTER_PATH:
            header = request.headers.get("authorization", "")
            who = partial(authenticate_node, self.service, header)
            if not await self.identify(scope, receive, send, "node", who):
                return
        why = other_version(request.headers.get(VERSION_HEADER))
        if why is not None:
            await problem(409, why, "Refused")(scope, receive, send)
            return
        await self.app(scope, receive, send)
