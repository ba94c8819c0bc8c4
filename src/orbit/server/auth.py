"""Who is calling: the bearer token, looked up (by its hash) on every request, so that a revoked
or expired token is refused at once; and what that user's role allows. A source that failed to
authenticate too often is turned away first (auth_failures.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property, partial
from typing import TypeVar

import anyio
from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from orbit.core.control.service import CoreControlService
from orbit.core.execution.service import canonical_placement
from orbit.model.auth import Role, TokenRecord, UserRecord, token_hash
from orbit.model.errors import Forbidden, InvalidInput, NotFound, StoreError
from orbit.model.permissions import PERMISSIONS, Roles
from orbit.model.records import RunRecord
from orbit.server.auth_failures import MALFORMED, MISSING, AuthFailed, AuthGuard
from orbit.wire.protocol import PREFIX as AGENT_PREFIX
from orbit.wire.protocol import REGISTER_PATH, VERSION_HEADER

T = TypeVar("T")
# placement kinds whose tasks run on the server's own host, as the server's user
SERVER_HOST = frozenset({"local"})


@dataclass(frozen=True)
class Caller:
    """The authenticated user of one request, the roles the server knows, and the service
    that will act for them."""

    user: UserRecord
    service: CoreControlService
    token: TokenRecord | None = None  # the token this request came with
    local_roles: tuple[str, ...] = (Role.ADMIN.value,)  # the server setting of that name
    roles: Roles = field(default_factory=Roles)  # the built-in ones and the site's

    @contextmanager
    def acting(self) -> Iterator[CoreControlService]:
        """The service, with every audit event of the block naming this user."""
        with self.service.acting_as(self.user.name):
            yield self.service

    def may(self, permission: str) -> bool:
        return self.roles.grants(self.user.role, permission)

    def require(self, permission: str) -> None:
        """Refuse (403) unless the user's role holds `permission`, saying which it lacks."""
        if not self.may(permission):
            raise Forbidden(self._lacks(permission))

    def require_run(self, run: RunRecord, family: str) -> None:
        """`family.any`, or `family.own` on the user's own run (`runs.cancel`, `logs.read`)."""
        why = self.refusal(run, family)
        if why is not None:
            raise Forbidden(why)

    def refusal(self, run: RunRecord, family: str) -> str | None:
        """Why this user may not do `family` to `run` (one of many acted on at once), or None.
        A run of a restricted experiment the user does not see never gets here: see_run and
        the listings' `viewer` leave it out first."""
        if self.may(f"{family}.any"):
            return None
        if not self.may(f"{family}.own"):
            return self._lacks(f"{family}.own")
        if run.created_by == self.user.name:
            return None
        return f"{run.created_by}'s run: " + self._lacks(f"{family}.any")

    def _lacks(self, permission: str) -> str:
        return (
            f"{self.user.name} ({self.user.role}) may not {PERMISSIONS[permission]}: "
            f"that needs the permission {permission}"
        )

    @property
    def viewer(self) -> str | None:
        """Whose view of the runs this is: None for one who sees every run (experiments.manage),
        else the user, who does not see restricted experiments they are not a member of."""
        return None if self.may("experiments.manage") else self.user.name

    @cached_property
    def hidden(self) -> frozenset[str]:
        """The ids of the experiments whose runs this user does not see."""
        if self.viewer is None:
            return frozenset()
        return frozenset(self.service.store.experiments.hidden_from(self.viewer))

    def see_run(self, ref: str) -> RunRecord:
        """The run, or NotFound as for a run that is not there when its experiment is
        restricted and the user not a member."""
        try:
            run = self.service.get_run(ref)
        except InvalidInput:  # an ambiguous prefix: its matches may be runs not to be named
            if not self.hidden:
                raise
            raise InvalidInput(f"run id '{ref}' is ambiguous (give more characters)") from None
        if run.experiment_id in self.hidden:
            raise NotFound(f"unknown run '{ref}' (see 'orbit runs list')")
        return run

    def seen(self, items: list[T], run_of: Callable[[T], str | None]) -> list[T]:
        """The `items` this user may see: not those about a run (`run_of`) of a restricted
        experiment they are not a member of (queue entries, audit events, alerts)."""
        if not self.hidden:
            return items
        assert self.viewer is not None
        runs = [r for r in map(run_of, items) if r is not None]
        gone = self.service.store.experiments.hidden_runs(self.viewer, runs)
        return [i for i in items if run_of(i) not in gone]

    def require_placement(self, template_id: str, kind: str) -> None:
        """Submitting, replaying or retrying into a template whose placement runs on this
        server's own host: its task could read what the server's user can (the store, the
        admin token), so only the roles the server setting `local_roles` names may."""
        if canonical_placement(kind) not in SERVER_HOST or self.user.role in self.local_roles:
            return
        allowed = " and ".join(f"{r}s" for r in self.local_roles)
        raise Forbidden(
            f"{self.user.name} ({self.user.role}) may not run template '{template_id}': "
            f"it runs on the server's own host, which only {allowed} may use "
            "(server setting local_roles)"
        )


def authenticate(service: CoreControlService, request: Request) -> tuple[UserRecord, TokenRecord]:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise AuthFailed(
            "this server needs a token: set ORBIT_TOKEN or run `orbit login URL` "
            "(the first admin token is in the server's admin-token file)",
            MISSING,
        )
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthFailed("the Authorization header must be `Bearer <token>`", MALFORMED)
    return check_token(service, token)


def check_token(service: CoreControlService, token: str) -> tuple[UserRecord, TokenRecord]:
    """The user and token `token` is, looked up by its hash; AuthFailed if it is not one the
    store accepts now (a bearer header's, or a console session's)."""
    hashed, now = token_hash(token.strip()), datetime.now(UTC)
    found = service.store.users.authenticate(hashed, now)
    if found is None:
        raise AuthFailed(
            "the token was not accepted (unknown, revoked or expired)",
            service.store.users.token_refusal(hashed, now),
        )
    return found


def user_state(service: CoreControlService, request: Request) -> dict[str, object]:
    """What RequireToken keeps of an authenticated user's request (see routes.caller)."""
    user, token = authenticate(service, request)
    return {"user": user, "token": token}


def console_state(service: CoreControlService, request: Request) -> dict[str, object]:
    """The user of a console request (/ui/), from its bearer header or else its session
    cookie (kept in the request's state with the session's CSRF token; None for a bearer)."""
    if request.headers.get("authorization"):
        user, token = authenticate(service, request)
        return {"user": user, "token": token, "csrf": None}
    from orbit.server.ui.session import COOKIE, csrf_for

    secret = request.cookies.get(COOKIE, "")
    if not secret:
        raise AuthFailed("sign in first", MISSING)
    user, token = check_token(service, secret)
    return {"user": user, "token": token, "csrf": csrf_for(secret)}


class RequireToken:
    """Every request but /healthz shows a token the store accepts, checked before anything
    reads its body: a client without one is turned away at once (401), not after uploading
    and parsing, and learns nothing of the API from validation errors. A source that failed
    too often lately is turned away before that (429), without a look at the store."""

    OPEN = frozenset({"/healthz"})

    def __init__(self, app: ASGIApp, service: CoreControlService, guard: AuthGuard) -> None:
        self.app, self.service, self.guard = app, service, guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.OPEN:
            await self.app(scope, receive, send)
            return
        if await self.limited(scope, receive, send):
            return
        if scope["path"].startswith(AGENT_PREFIX):
            await self.agent(scope, receive, send)
            return
        if scope["path"] == "/ui" or scope["path"].startswith("/ui/"):
            await self.console(scope, receive, send)
            return
        who = partial(user_state, self.service, Request(scope))
        if await self.identify(scope, receive, send, "user", who):
            await self.app(scope, receive, send)

    async def limited(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer 429 (and True) when the request's source is refused for a while."""
        from orbit.server.problems import problem

        wait = self.guard.retry_after(scope)
        if wait is None:
            return False
        detail = (
            f"too many failed authentications from this address: try again in {wait} s "
            "(server setting auth_failures)"
        )
        answer = problem(429, detail, "Unauthorized", headers={"Retry-After": str(wait)})
        await answer(scope, receive, send)
        return True

    async def identify(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        kind: str,
        who: Callable[[], dict[str, object]],
        refuse: Callable[[AuthFailed], ASGIApp] | None = None,
    ) -> bool:
        """Who is calling, found by `who` (in a worker thread: it reads the store) and kept in
        the request's state; or the answer that refuses it (401, or 503 when the store
        fails), and False. A refused `kind` of credential is counted, logged and limited by
        its source."""
        from orbit.server.problems import problem, store_failed

        try:
            found = await anyio.to_thread.run_sync(who)
        except AuthFailed as exc:
            self.guard.failed(scope, kind, exc.reason)
            answer = problem(401, str(exc), "Unauthorized") if refuse is None else refuse(exc)
            await answer(scope, receive, send)
            return False
        except StoreError as exc:
            await store_failed(exc)(scope, receive, send)
            return False
        scope.setdefault("state", {}).update(found)
        return True

    async def console(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A console request: its session cookie (or a bearer header). Without either, a page
        sends the browser to the sign-in form; the sign-in form and the console's own files
        need none."""
        from orbit.server.ui.session import is_open, to_sign_in

        path = scope["path"]
        if path == "/ui" or is_open(path):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        who = partial(console_state, self.service, request)
        refuse = None
        if scope["method"] == "GET" and not request.headers.get("authorization"):
            query = scope.get("query_string", b"").decode("latin-1")

            def refuse(exc: AuthFailed) -> ASGIApp:
                return to_sign_in(path, query, None if exc.reason == MISSING else str(exc))

        if await self.identify(scope, receive, send, "console", who, refuse):
            await self.app(scope, receive, send)

    async def agent(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An agent's request: its node credential (registering needs none: its join token
        is in the body), then its protocol version."""
        from orbit.server.agents.identity import authenticate_node, other_version
        from orbit.server.problems import problem

        request = Request(scope)
        if scope["path"] != REGISTER_PATH:
            header = request.headers.get("authorization", "")

            def who() -> dict[str, object]:
                return {"node": authenticate_node(self.service, header)}

            if not await self.identify(scope, receive, send, "node", who):
                return
        why = other_version(request.headers.get(VERSION_HEADER))
        if why is not None:
            await problem(409, why, "Refused")(scope, receive, send)
            return
        await self.app(scope, receive, send)
