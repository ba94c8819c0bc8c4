"""/api/v1/secrets: secrets set, listed and removed, never read back (no route returns a
value), and the keys that seal them rotated. A member keeps its own; only an admin sets or
removes a shared one (an experiment's, or everyone's) or rotates the keys."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from pydantic import Field

from orbit.core.control.service import CoreControlService
from orbit.model.secrets import MAX_VALUE_BYTES, KeyRotation, Scope, SecretRecord
from orbit.server.auth import Caller
from orbit.server.routes.common import Body, api_router, me

NAME = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class SecretValue(Body):
    # UTF-8 text of at most 64 KiB (checked in bytes by the service: a character may be four)
    value: str = Field(min_length=1, max_length=MAX_VALUE_BYTES)
    scope: Scope = Scope.USER
    experiment: str | None = Field(default=None, min_length=1, max_length=128)


def _may(who: Caller, scope: Scope) -> None:
    """A secret of the caller's own is the gate's (secrets.write); a shared one needs more."""
    if scope is not Scope.USER:
        who.require("secrets.shared.write")


def make_secrets_router(service: CoreControlService) -> APIRouter:
    router = api_router()

    @router.get("/secrets", response_model=list[SecretRecord], tags=["secrets"])
    def list_secrets(who: me, scope: Annotated[Scope | None, Query()] = None) -> list[SecretRecord]:
        """Names, scopes, owners and times, never values: a member's own and the shared ones;
        with users.manage: every one."""
        found = service.list_secrets(scope)
        if who.may("users.manage"):
            return found
        return [s for s in found if s.scope is not Scope.USER or s.owner == who.user.name]

    @router.put(
        "/secrets/{name}",
        response_model=SecretRecord,
        tags=["secrets"],
        responses={201: {"model": SecretRecord, "description": "A new secret"}},
    )
    def set_secret(who: me, name: NAME, body: SecretValue, response: Response) -> SecretRecord:
        """Set the secret's value: the caller's own, or (admins) an experiment's or everyone's.
        201 when it is new; 200 when it replaced a value (its `rotated_at`)."""
        _may(who, body.scope)
        with who.acting() as svc:
            made = svc.set_secret(name, body.value.encode(), body.scope, body.experiment)
        response.status_code = 201 if made.rotated_at is None else 200
        return made

    @router.delete("/secrets/{name}", response_model=SecretRecord, tags=["secrets"])
    def remove_secret(
        who: me,
        name: NAME,
        scope: Annotated[Scope, Query()] = Scope.USER,
        experiment: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
    ) -> SecretRecord:
        _may(who, scope)
        with who.acting() as svc:
            return svc.remove_secret(name, scope, experiment)

    @router.post("/secrets/rotate-key", response_model=KeyRotation, tags=["secrets"])
    def rotate_key(who: me) -> KeyRotation:
        """A new key seals every value from now on; the old ones are retired once no value is
        sealed under them. Replicas sharing the key file follow at their next use."""
        with who.acting() as svc:
            return svc.rotate_secret_key()

    return router
