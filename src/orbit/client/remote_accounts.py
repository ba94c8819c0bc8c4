"""Users, tokens and secrets, the accounts part of the HTTP client (orbit.client.remote's
RemoteControl names these methods as its own). A secret's value is sent once, in a request's
body, and never comes back."""

from __future__ import annotations

from orbit.client.session import Session, part, query
from orbit.model.auth import NewToken, TokenRecord, UserRecord
from orbit.model.permissions import RoleView
from orbit.model.secrets import KeyRotation, Scope, SecretRecord


class RemoteAccounts:
    def __init__(self, session: Session) -> None:
        self.session = session

    def whoami(self) -> UserRecord | None:
        return self.session.get(UserRecord, "/whoami")

    def sign_in_link(self) -> str:
        """A link that signs this token in to the server's web console, once, for 2 minutes."""
        return self.session.url + str(self.session.send("POST", "/ui/links").json()["path"])

    def list_users(self) -> list[UserRecord]:
        return self.session.get_list(UserRecord, "/users")

    def add_user(self, name: str, role: str) -> UserRecord:
        return self.session.post(UserRecord, "/users", {"name": name, "role": role})

    def set_role(self, name: str, role: str) -> UserRecord:
        response = self.session.send("PATCH", f"/users/{part(name)}", json={"role": role})
        return UserRecord.model_validate_json(response.content)

    def roles(self) -> list[RoleView]:
        """Every role the server knows, with its permissions."""
        return self.session.get_list(RoleView, "/roles")

    def remove_user(self, name: str) -> UserRecord:
        return UserRecord.model_validate_json(
            self.session.send("DELETE", f"/users/{part(name)}").content
        )

    def create_token(
        self, user: str | None = None, name: str | None = None, expires: str | None = None
    ) -> NewToken:
        return self.session.post(
            NewToken, "/tokens", {"user": user, "name": name, "expires": expires}
        )

    def list_tokens(self, user: str | None = None) -> list[TokenRecord]:
        return self.session.get_list(TokenRecord, "/tokens", user=user)

    def revoke_token(self, token_id: str) -> TokenRecord:
        response = self.session.send("DELETE", f"/tokens/{part(token_id)}")
        return TokenRecord.model_validate_json(response.content)

    def set_secret(
        self, name: str, value: bytes, scope: Scope = Scope.USER, experiment: str | None = None
    ) -> SecretRecord:
        body = {"value": value.decode("utf-8"), "scope": scope.value, "experiment": experiment}
        response = self.session.send("PUT", f"/secrets/{part(name)}", json=body)
        return SecretRecord.model_validate_json(response.content)

    def list_secrets(self, scope: Scope | None = None) -> list[SecretRecord]:
        return self.session.get_list(SecretRecord, "/secrets", scope=scope and scope.value)

    def remove_secret(
        self, name: str, scope: Scope = Scope.USER, experiment: str | None = None
    ) -> SecretRecord:
        params = query({"scope": scope.value, "experiment": experiment})
        response = self.session.send("DELETE", f"/secrets/{part(name)}", params=params)
        return SecretRecord.model_validate_json(response.content)

    def rotate_secret_key(self) -> KeyRotation:
        return self.session.post(KeyRotation, "/secrets/rotate-key")
