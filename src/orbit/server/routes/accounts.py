"""/api/v1/whoami, /roles, /users and /tokens: who the caller is, the roles the server knows and
what each allows, the users (users.manage), and API tokens (the caller's own; with
users.manage: anyone's)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import Field

from orbit.core.control.service import CoreControlService
from orbit.model.auth import NewToken, Role, TokenRecord, UserRecord
from orbit.model.errors import Forbidden
from orbit.model.permissions import ROLE_NAME, RoleView
from orbit.server.routes.common import Body, api_router, me

RoleName = Annotated[str, Field(pattern=ROLE_NAME, examples=["member"])]


class NewUser(Body):
    name: str = Field(min_length=1, max_length=64)
    role: RoleName = Role.MEMBER.value


class UserChange(Body):
    role: RoleName


class NewTokenBody(Body):
    user: str | None = Field(default=None, min_length=1, max_length=64)
    name: str | None = Field(default=None, min_length=1, max_length=128)
    expires: str | None = Field(default=None, min_length=1, max_length=16, examples=["30d"])


def make_accounts_router(service: CoreControlService) -> APIRouter:
    router = api_router()

    # -- who am I ------------------------------------------------------------------------
    @router.get("/whoami", response_model=UserRecord, tags=["users"])
    def whoami(who: me) -> UserRecord:
        return who.user

    # -- users and tokens ------------------------------------------------------------------
    @router.get("/roles", response_model=list[RoleView], tags=["users"])
    def roles(who: me) -> list[RoleView]:
        """Every role this server knows (built in, and the site's) with its permissions."""
        return who.roles.views()

    @router.get("/users", response_model=list[UserRecord], tags=["users"])
    def list_users(who: me) -> list[UserRecord]:
        return service.list_users()

    @router.post("/users", response_model=UserRecord, status_code=201, tags=["users"])
    def add_user(who: me, body: NewUser) -> UserRecord:
        with who.acting() as svc:
            return svc.add_user(body.name, who.roles.check(body.role))

    @router.patch("/users/{name}", response_model=UserRecord, tags=["users"])
    def set_user(who: me, name: str, body: UserChange) -> UserRecord:
        """Give a user another role (audited as `user.role`); the last admin keeps theirs."""
        with who.acting() as svc:
            return svc.set_role(name, who.roles.check(body.role))

    @router.delete("/users/{name}", response_model=UserRecord, tags=["users"])
    def remove_user(who: me, name: str) -> UserRecord:
        with who.acting() as svc:
            return svc.remove_user(name)

    @router.get("/tokens", response_model=list[TokenRecord], tags=["users"])
    def list_tokens(
        who: me, user: Annotated[str | None, Query(max_length=64)] = None
    ) -> list[TokenRecord]:
        """The caller's own tokens; with users.manage: everyone's, or one user's."""
        if not who.may("users.manage"):
            if user not in (None, who.user.name):
                raise Forbidden(f"{who.user.name} may list only their own tokens")
            user = who.user.name
        return service.list_tokens(user)

    @router.post("/tokens", response_model=NewToken, status_code=201, tags=["users"])
    def create_token(who: me, body: NewTokenBody) -> NewToken:
        """A new token, shown in this answer only (the server keeps its hash). It expires no
        later than the token that asks for it (`clamped` says when that cut it short)."""
        user = body.user or who.user.name
        if user != who.user.name:
            who.require("users.manage")
        not_after = who.token.expires_at if who.token is not None else None
        with who.acting() as svc:
            return svc.create_token(user, body.name, body.expires, not_after=not_after)

    @router.delete("/tokens/{token_id}", response_model=TokenRecord, tags=["users"])
    def revoke_token(who: me, token_id: str) -> TokenRecord:
        found = service.store.users.get_token(token_id)
        if found.user != who.user.name:
            who.require("users.manage")
        with who.acting() as svc:
            return svc.revoke_token(token_id)

    return router
