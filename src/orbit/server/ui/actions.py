"""What the console does, as form posts: sign in (a token, or a one-time link) and out, and the
buttons (cancel, retry, replay with overrides, a node's drain / cordon / uncordon / max tasks;
the admin page's are admin.py's). Each post must carry the session's CSRF token; each is
checked against the caller's role exactly as its API route is, by the same control service
calls."""

from __future__ import annotations

import hmac
import re
import secrets
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from orbit.core.control.service import CoreControlService
from orbit.model.errors import Forbidden, InvalidInput, OrbitError
from orbit.model.overrides import parse_overrides
from orbit.model.spec import parse_sets
from orbit.server.auth import Caller, check_token
from orbit.server.auth_failures import AuthFailed
from orbit.server.routes.common import api_router, me
from orbit.server.ui.common import console_router, error_page, status_of
from orbit.server.ui.render import page
from orbit.server.ui.session import (
    CSRF_FIELD,
    CSRF_HEADER,
    LOGIN_CSRF,
    NOTICE,
    PREFIX,
    SignInLinks,
    end_session,
    notice_of,
    safe_next,
    say_next,
    start_session,
)


async def csrf_checked(request: Request) -> dict[str, Any]:
    """The form's fields, once its CSRF token is the session's (a bearer header needs none)."""
    form = dict(await request.form())
    expected = getattr(request.state, "csrf", None)
    if expected is not None:
        given = str(form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER, ""))
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise Forbidden("this form's CSRF token is missing or stale: reload the page")
    return {k: str(v) for k, v in form.items()}


def refused(request: Request, who: Any, exc: OrbitError) -> Response:
    """A form's refusal as the error page, with the status its API route would answer."""
    return error_page(request, who, status_of(exc), str(exc))


def back(to: str, notice: str) -> Response:
    """To the page `to`, which then says `notice`."""
    return say_next(RedirectResponse(to, status_code=303), notice, to)


LINK_USED = "that sign-in link was used already or has expired: run `orbit ui` again"


def make_action_pages(service: CoreControlService, links: SignInLinks) -> APIRouter:
    router = console_router()

    @router.get("/login")
    def login_form(request: Request, next: str | None = None) -> Response:
        nonce = secrets.token_urlsafe(16)
        why = notice_of(request)
        response = page("login.html", next=safe_next(next), why=why, csrf=nonce, nav=(), section="")
        if why:
            response.delete_cookie(NOTICE, path=f"{PREFIX}/login")
        secure = request.url.scheme == "https"
        response.set_cookie(
            LOGIN_CSRF, nonce, path=f"{PREFIX}/login", httponly=True, samesite="strict",
            secure=secure,
        )  # fmt: skip
        return response

    @router.post("/login")
    async def login(request: Request) -> Response:
        form = dict(await request.form())
        nonce, secure = request.cookies.get(LOGIN_CSRF, ""), request.url.scheme == "https"
        if not nonce or not hmac.compare_digest(str(form.get(CSRF_FIELD, "")), nonce):
            return _login_again(form, "the sign-in form was stale: try again", 403, secure)
        secret = str(form.get("token", "")).strip()
        try:
            _, token = check_token(service, secret)
        except AuthFailed as exc:
            request.app.state.auth_guard.failed(request.scope, "console", exc.reason)
            return _login_again(form, str(exc), 401, secure)
        response = RedirectResponse(safe_next(str(form.get("next", ""))), status_code=303)
        start_session(response, secret, token, request.url.scheme == "https")
        response.delete_cookie(LOGIN_CSRF, path=f"{PREFIX}/login")
        return response

    @router.post("/login/out")
    def logout(request: Request) -> Response:
        """Sign out: the cookie goes, even where its token no longer works (the path is the
        sign-in form's, which needs no session; all it can do is sign a browser out). Before
        /login/{code}, which would take `out` for a link's code."""
        response = to_login("signed out")
        end_session(response)
        return response

    @router.get("/login/{code}")
    def sign_in_link_form(request: Request, code: str) -> Response:
        """A sign-in link asks first: a link another person made must not sign this browser
        in as them unawares (the POST needs this form's own CSRF cookie)."""
        who = links.peek(code)
        if who is None:
            return to_login(LINK_USED)
        try:
            user, _ = check_token(service, who)
        except AuthFailed as exc:
            return to_login(str(exc))
        nonce = secrets.token_urlsafe(16)
        response = page(
            "link.html", user=user, link_code=code, csrf=nonce, nav=(), section="", me=None
        )
        response.set_cookie(
            LOGIN_CSRF, nonce, path=f"{PREFIX}/login", httponly=True, samesite="strict",
            secure=request.url.scheme == "https",
        )  # fmt: skip
        return response

    @router.post("/login/{code}")
    async def sign_in_link(request: Request, code: str) -> Response:
        form = dict(await request.form())
        nonce = request.cookies.get(LOGIN_CSRF, "")
        if not nonce or not hmac.compare_digest(str(form.get(CSRF_FIELD, "")), nonce):
            return to_login("the sign-in form was stale: open the link again")
        secret = links.take(code)
        if secret is None:
            return to_login(LINK_USED)
        try:
            _, token = check_token(service, secret)
        except AuthFailed as exc:
            return to_login(str(exc))
        response = RedirectResponse(f"{PREFIX}/", status_code=303)
        start_session(response, secret, token, request.url.scheme == "https")
        response.delete_cookie(LOGIN_CSRF, path=f"{PREFIX}/login")
        return response

    async def run_action(request: Request, who: Caller, ref: str, action: str) -> Response:
        try:
            form = await csrf_checked(request)
            done = await _run_action(who, ref, action, form)
        except OrbitError as exc:
            return refused(request, who, exc)
        return back(f"{PREFIX}/runs/{done[0]}", done[1])

    # one route per action, each with its permission (server.permissions.CONSOLE)
    @router.post("/runs/{ref}/cancel")
    async def run_cancel(request: Request, who: me, ref: str) -> Response:
        return await run_action(request, who, ref, "cancel")

    @router.post("/runs/{ref}/retry")
    async def run_retry(request: Request, who: me, ref: str) -> Response:
        return await run_action(request, who, ref, "retry")

    @router.post("/runs/{ref}/replay")
    async def run_replay(request: Request, who: me, ref: str) -> Response:
        return await run_action(request, who, ref, "replay")

    @router.post("/nodes/{name}/set")
    async def node_set(request: Request, who: me, name: str) -> Response:
        try:
            form = await csrf_checked(request)
            change = _node_change(form)
            with who.acting() as acting:
                node = acting.set_node(name, **change)
        except OrbitError as exc:
            return refused(request, who, exc)
        return back(f"{PREFIX}/nodes/{node.name}", f"{node.name}: saved")

    return router


def make_link_route(links: SignInLinks) -> APIRouter:
    """POST /api/v1/ui/links: a one-time sign-in link for the caller's own token (`orbit ui`)."""
    router = api_router()

    @router.post("/ui/links", tags=["users"], response_model=dict[str, str])
    def console_link(request: Request, who: me) -> dict[str, str]:
        """A path that signs the caller in to the console once, within two minutes."""
        secret = request.headers.get("authorization", "").partition(" ")[2].strip()
        return {"path": f"{PREFIX}/login/{links.make(secret)}"}

    return router


async def _run_action(who: Any, ref: str, action: str, form: dict[str, str]) -> tuple[str, str]:
    import anyio

    def act() -> tuple[str, str]:
        with who.acting() as acting:
            run = acting.get_run(ref)  # whose run it is: the console's gate (runs.*.own)
            if action == "cancel":
                acting.ask_to_cancel(run.id, 0)
                return run.id, "cancel asked: the task has its grace period to stop"
            overrides = parse_overrides(parse_sets(_sets(form.get("set", ""))), "--set")
            if action == "retry":
                who.require_placement(run.template_id, run.request.placement.kind)
                acting.retry_run(run.id, overrides)
                return run.id, "retried: a new attempt"
            if action == "replay":
                who.require_placement(run.template_id, run.request.placement.kind)
                new = acting.replay_run(run.id, overrides)
                return new.id, f"replay of {run.id}"
        raise AssertionError(action)  # the routes above name one of the three

    return await anyio.to_thread.run_sync(act)


def _sets(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _node_change(form: dict[str, str]) -> dict[str, Any]:
    what = form.get("do", "")
    reason = form.get("reason") or None
    if what == "drain":
        return {"max_tasks": 0, "reason": reason}
    if what == "cordon":
        return {"cordon": True, "reason": reason}
    if what == "uncordon":
        return {"cordon": False}
    if what == "max_tasks":
        value = form.get("max_tasks", "")
        if not re.fullmatch(r"[0-9]{1,6}", value):
            raise InvalidInput(f"max tasks must be a whole number, not '{value}'")
        return {"max_tasks": int(value)}
    raise InvalidInput(f"unknown node change '{what}' (drain, cordon, uncordon or max_tasks)")


def to_login(why: str) -> Response:
    return say_next(RedirectResponse(f"{PREFIX}/login", status_code=303), why, f"{PREFIX}/login")


def _login_again(form: dict[str, Any], why: str, status: int, secure: bool) -> Response:
    nonce = secrets.token_urlsafe(16)
    response = page(
        "login.html", status, next=safe_next(str(form.get("next", ""))), why=why, csrf=nonce,
        nav=(), section="",
    )  # fmt: skip
    response.set_cookie(LOGIN_CSRF, nonce, path=f"{PREFIX}/login", httponly=True, samesite="strict",
                        secure=secure)  # fmt: skip
    return response
