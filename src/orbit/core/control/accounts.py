"""Users and their tokens. Who may do what is the server's to check (embedded mode has one
user and no tokens); these only do it, and audit it."""

from __future__ import annotations

from datetime import UTC, datetime

from orbit.core.control.base import ServicePart
from orbit.model.auth import NewToken, TokenRecord, UserRecord, new_token
from orbit.model.auth import token_hash as hash_of
from orbit.model.durations import parse_duration
from orbit.model.errors import InvalidInput
from orbit.model.permissions import Roles, RoleView


class Accounts(ServicePart):
    def whoami(self) -> UserRecord | None:
        """The signed-in user; None embedded, where the local user acts and needs no token."""
        return None

    def list_users(self) -> list[UserRecord]:
        return self.store.users.list_users()

    def add_user(self, name: str, role: str) -> UserRecord:
        """A new user with `role` (the caller checks it is one the server knows)."""
        return self.store.users.create_user(name, role, self.actor)

    def roles(self) -> list[RoleView]:
        """The roles and their permissions: embedded, the built-in ones (a server adds its
        site's)."""
        return Roles().views()

    def set_role(self, name: str, role: str) -> UserRecord:
        """Give a user another role (the caller checks it is one the server knows)."""
        return self.store.users.set_role(name, role, self.actor)

    def remove_user(self, name: str) -> UserRecord:
        """Remove a user; their tokens stop working at once."""
        return self.store.users.remove_user(name, self.actor)

    def create_token(
        self,
        user: str | None = None,
        name: str | None = None,
        expires: str | None = None,
        *,
        not_after: datetime | None = None,
    ) -> NewToken:
        """A new token for `user` (by default the caller), shown this once: the store keeps
        only its hash. `expires` is a duration (30d, 12h); none: it lasts until revoked.
        `not_after`: the expiry of the token that asks (a server's caller); the new token
        expires no later, and the answer says when that cut its life short."""
        user = user or self._signed_in()
        expires_at = datetime.now(UTC) + parse_duration(expires, "--expires") if expires else None
        clamped = not_after is not None and (expires_at is None or expires_at > not_after)
        if clamped:
            expires_at = not_after
        token = new_token()
        record = self.store.users.create_token(
            user, token_hash=hash_of(token), name=name, expires_at=expires_at, actor=self.actor
        )
        return NewToken(token=token, record=record, clamped=clamped)

    def list_tokens(self, user: str | None = None) -> list[TokenRecord]:
        return self.store.users.list_tokens(user)

    def revoke_token(self, token_id: str) -> TokenRecord:
        return self.store.users.revoke_token(token_id, self.actor)

    def _signed_in(self) -> str:
        found = self.whoami()
        if found is None:
            raise InvalidInput(
                "--user: name the user the token is for (embedded mode has no signed-in user)"
            )
        return found.name
