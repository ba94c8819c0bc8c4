"""The admin page's forms: a token made (shown this once, never again) or revoked, a join token
made for agents, a quota set or removed. Each checks the caller's role as its API route does
and carries the session's CSRF token."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import TypeAdapter, ValidationError
from starlette.responses import Response

from orbit.core.control.service import CoreControlService
from orbit.model.errors import InvalidInput, OrbitError
from orbit.server.routes.common import me
from orbit.server.routes.scheduling import QUOTA_NAME, QUOTA_SCOPE, QuotaBody
from orbit.server.ui.actions import back, csrf_checked, refused
from orbit.server.ui.common import console_router, context
from orbit.server.ui.render import page
from orbit.server.ui.session import PREFIX


def shown_once(request: Request, who: me, **values: object) -> Response:
    response = page("token_made.html", **context(request, who, "admin", **values))
    response.headers["Cache-Control"] = "no-store"  # shown this once: never kept
    return response


def make_admin_pages(service: CoreControlService) -> APIRouter:
    router = console_router()

    @router.post("/admin/tokens")
    async def token_made(request: Request, who: me) -> Response:
        try:
            form = await csrf_checked(request)
            user = form.get("user") or who.user.name
            if user != who.user.name:
                who.require("users.manage")
            not_after = who.token.expires_at if who.token is not None else None
            with who.acting() as acting:
                made = acting.create_token(
                    user, form.get("name") or None, form.get("expires") or None,
                    not_after=not_after,
                )  # fmt: skip
        except OrbitError as exc:
            return refused(request, who, exc)
        return shown_once(
            request, who, what=f"Token for {made.record.user}", secret=made.token,
            clamped=made.clamped,
        )  # fmt: skip

    @router.post("/admin/tokens/{token_id}/revoke")
    async def token_revoke(request: Request, who: me, token_id: str) -> Response:
        try:
            await csrf_checked(request)
            if service.store.users.get_token(token_id).user != who.user.name:
                who.require("users.manage")
            with who.acting() as acting:
                acting.revoke_token(token_id)
        except OrbitError as exc:
            return refused(request, who, exc)
        return back(f"{PREFIX}/admin", f"token {token_id} revoked")

    @router.post("/admin/join-tokens")
    async def join_token_made(request: Request, who: me) -> Response:
        try:
            form = await csrf_checked(request)
            labels = _labels(form.get("labels", ""))
            with who.acting() as acting:
                made = acting.create_join_token(labels, form.get("expires") or None)
        except OrbitError as exc:
            return refused(request, who, exc)
        return shown_once(request, who, what="Join token for agents", secret=made.token)

    @router.post("/admin/quotas")
    async def quota_set(request: Request, who: me) -> Response:
        try:
            form = await csrf_checked(request)
            scope, name, body = _quota(form)
            with who.acting() as acting:
                acting.set_quota(scope, name, body.gpus, body.weight)
        except OrbitError as exc:
            return refused(request, who, exc)
        return back(f"{PREFIX}/admin", f"quota of {scope} {name}: {body.gpus} GPUs")

    @router.post("/admin/quotas/{scope}/{name}/remove")
    async def quota_remove(request: Request, who: me, scope: str, name: str) -> Response:
        try:
            await csrf_checked(request)
            with who.acting() as acting:
                acting.remove_quota(scope, name)
        except OrbitError as exc:
            return refused(request, who, exc)
        return back(f"{PREFIX}/admin", f"quota of {scope} {name} removed")

    return router


def _labels(text: str) -> dict[str, str]:
    """`rack=a, gpu=h100` as labels."""
    labels = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidInput(f"labels: expected key=value, e.g. rack=a, not '{item}'")
        labels[key.strip()] = value.strip()
    return labels


def _quota(form: dict[str, str]) -> tuple[str, str, QuotaBody]:
    """The quota form as the API's PUT /quotas/{scope}/{name} takes it, checked as it is."""
    scope, name = form.get("scope", ""), form.get("name", "").strip()
    try:
        TypeAdapter(QUOTA_SCOPE).validate_python(scope)
        TypeAdapter(QUOTA_NAME).validate_python(name)
    except ValidationError:
        raise InvalidInput("a quota is a user's or an experiment's, by a name (no '/')") from None
    raw = {"gpus": form.get("gpus", "").strip(), "weight": form.get("weight", "").strip() or 1}
    try:
        return scope, name, QuotaBody.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise InvalidInput(f"{error['loc'][0]}: {error['msg'].lower()}") from None
