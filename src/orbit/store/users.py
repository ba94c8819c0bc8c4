"""Users and their API tokens in the store; each change audited, in its own transaction.

The store keeps a token's sha256 only (orbit.model.auth.token_hash): neither the token nor its
hash is ever returned in a record or written to the audit trail."""

from __future__ import annotations

import re
from contextlib import suppress
from datetime import datetime, timedelta

from orbit.model.auth import Role, TokenRecord, UserRecord
from orbit.model.errors import InvalidInput, NotFound, Refused
from orbit.store.audit import append_event
from orbit.store.base import Part, new_id, utcnow
from orbit.store.drivers import Conflict
from orbit.store.sql import Row, StoreError, Tx, read_time, read_time_required

USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
TOKEN_NAME_MAX = 128
# authenticate() records a token's use only when the stored time is older than this: one small
# write a minute per token, not one per request
LAST_USED_EVERY = timedelta(seconds=60)

USER_COLUMNS = "u.id, u.name, u.role, u.created_at, u.created_by"
TOKEN_COLUMNS = (
    "t.id AS token_id, u.name AS user_name, t.name AS token_name, t.created_at AS token_created, "
    "t.expires_at, t.revoked_at, t.last_used_at"
)
TOKENS_FROM = "tokens t JOIN users u ON u.id = t.user_id"


def user_record(row: Row) -> UserRecord:
    return UserRecord(
        id=row["id"],
        name=row["name"],
        role=row["role"],
        created_at=read_time_required(row["created_at"]),
        created_by=row["created_by"],
    )


def token_record(row: Row) -> TokenRecord:
    return TokenRecord(
        id=row["token_id"],
        user=row["user_name"],
        name=row["token_name"],
        created_at=read_time_required(row["token_created"]),
        expires_at=read_time(row["expires_at"]),
        revoked_at=read_time(row["revoked_at"]),
        last_used_at=read_time(row["last_used_at"]),
    )


def no_user(name: str) -> NotFound:
    return NotFound(f"no user '{name}'")


# the actors ORBIT's own moves are audited as: no user may pose as them
SYSTEM_ACTORS = frozenset({"orbit", "orbit-server"})


def check_user_name(name: str) -> None:
    if not USER_NAME.fullmatch(name):
        raise InvalidInput(
            f"user name '{name}': use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    if name.lower() in SYSTEM_ACTORS:
        raise InvalidInput(f"user name '{name}': reserved for ORBIT's own entries in the audit")


def lock_users(tx: Tx) -> None:
    """Serialise the writes that look at all users before changing them (the first admin, the
    last admin). SQLite's BEGIN IMMEDIATE already does; PostgreSQL's READ COMMITTED does not.
    EXCLUSIVE mode still lets authenticate() read."""
    if tx.dialect == "postgresql":
        tx.execute("LOCK TABLE users IN EXCLUSIVE MODE")


def _locked_user(tx: Tx, name: str) -> UserRecord:
    """User `name`, read under the users' lock (a change of who is admin waits for another)."""
    lock_users(tx)
    row = tx.one(f"SELECT {USER_COLUMNS} FROM users u WHERE u.name = :name", {"name": name})
    if row is None:
        raise no_user(name)
    return user_record(row)


def _not_the_last_admin(tx: Tx, user: UserRecord) -> None:
    if user.role != Role.ADMIN:
        return
    admins = tx.scalar(
        "SELECT count(*) FROM users WHERE role = :admin", {"admin": Role.ADMIN.value}
    )
    if admins <= 1:
        raise Refused(f"user '{user.name}' is the last admin; add another admin first")


class Users(Part):
    def create_user(self, name: str, role: str, actor: str) -> UserRecord:
        check_user_name(name)
        try:
            with self._write() as tx:
                return self._insert_user(tx, name, getattr(role, "value", role), actor)
        except Conflict:  # the name is taken (perhaps by a writer that just committed)
            raise InvalidInput(f"user '{name}' already exists") from None

    @staticmethod
    def _insert_user(tx: Tx, name: str, role: str, actor: str) -> UserRecord:
        record = UserRecord(
            id=new_id("user"), name=name, role=role, created_at=utcnow(), created_by=actor
        )
        tx.execute(
            "INSERT INTO users (id, name, role, created_at, created_by) "
            "VALUES (:id, :name, :role, :created_at, :created_by)",
            {
                "id": record.id,
                "name": name,
                "role": role,
                "created_at": record.created_at,
                "created_by": actor,
            },
        )
        append_event(tx, actor, "user.add", user=name, role=role)
        return record

    def list_users(self) -> list[UserRecord]:
        """By name."""
        with self._read() as tx:
            rows = tx.all(f"SELECT {USER_COLUMNS} FROM users u ORDER BY u.name")
        return [user_record(r) for r in rows]

    def get_user(self, name: str) -> UserRecord:
        with self._read() as tx:
            row = tx.one(f"SELECT {USER_COLUMNS} FROM users u WHERE u.name = :name", {"name": name})
        if row is None:
            raise no_user(name)
        return user_record(row)

    def count_users(self) -> int:
        with self._read() as tx:
            return int(tx.scalar("SELECT count(*) FROM users") or 0)

    def remove_user(self, name: str, actor: str) -> UserRecord:
        """Remove a user and delete its tokens with it: they stop working at once; and their
        places among restricted experiments' members (a new user of that name gets none). The
        last admin stays (no one could add another)."""
        with self._write() as tx:
            user = _locked_user(tx, name)
            _not_the_last_admin(tx, user)
            tokens = tx.execute("DELETE FROM tokens WHERE user_id = :id", {"id": user.id})
            tx.execute("DELETE FROM users WHERE id = :id", {"id": user.id})
            tx.execute("DELETE FROM experiment_members WHERE user_name = :name", {"name": name})
            append_event(tx, actor, "user.remove", user=name, role=user.role, tokens=tokens)
        return user

    def set_role(self, name: str, role: str, actor: str) -> UserRecord:
        """Give user `name` another role (audited as `user.role`, with the one it had); the
        last admin keeps theirs."""
        with self._write() as tx:
            user = _locked_user(tx, name)
            if user.role == role:
                return user
            if role != Role.ADMIN:
                _not_the_last_admin(tx, user)
            tx.execute(
                "UPDATE users SET role = :role WHERE id = :id", {"role": role, "id": user.id}
            )
            append_event(tx, actor, "user.role", user=name, role=role, was=user.role)
        return user.model_copy(update={"role": role})

    def create_token(
        self,
        user: str,
        *,
        token_hash: str,
        name: str | None,
        expires_at: datetime | None,
        actor: str,
    ) -> TokenRecord:
        """Keep a new token of `user`'s, by its hash (orbit.model.auth.token_hash)."""
        if name is not None and len(name) > TOKEN_NAME_MAX:
            raise InvalidInput(f"token name: at most {TOKEN_NAME_MAX} characters")
        with self._write() as tx:
            user_id = tx.scalar("SELECT id FROM users WHERE name = :name", {"name": user})
            if user_id is None:
                raise no_user(user)
            return self._insert_token(
                tx,
                user_id,
                user,
                token_hash=token_hash,
                name=name,
                expires_at=expires_at,
                actor=actor,
            )

    @staticmethod
    def _insert_token(
        tx: Tx,
        user_id: str,
        user: str,
        *,
        token_hash: str,
        name: str | None,
        expires_at: datetime | None,
        actor: str,
    ) -> TokenRecord:
        if not SHA256_HEX.fullmatch(token_hash):  # never the plain token by mistake
            raise ValueError("token_hash: expected a sha256 hex digest (orbit.model.auth)")
        record = TokenRecord(
            id=new_id("tok"),
            user=user,
            name=name,
            created_at=utcnow(),
            expires_at=expires_at,
            revoked_at=None,
            last_used_at=None,
        )
        tx.execute(
            "INSERT INTO tokens (id, user_id, name, hash, created_at, expires_at) "
            "VALUES (:id, :user_id, :name, :hash, :created_at, :expires_at)",
            {
                "id": record.id,
                "user_id": user_id,
                "name": name,
                "hash": token_hash,
                "created_at": record.created_at,
                "expires_at": expires_at,
            },
        )
        append_event(
            tx,
            actor,
            "token.create",
            user=user,
            token_id=record.id,
            name=name,
            expires_at=expires_at.isoformat() if expires_at is not None else None,
        )
        return record

    def list_tokens(self, user: str | None = None) -> list[TokenRecord]:
        """Newest first, revoked and expired ones included; of one user, or of everyone."""
        where = "WHERE u.name = :user" if user is not None else ""
        with self._read() as tx:
            if (
                user is not None
                and tx.scalar("SELECT id FROM users WHERE name = :name", {"name": user}) is None
            ):
                raise no_user(user)
            rows = tx.all(
                f"SELECT {TOKEN_COLUMNS} FROM {TOKENS_FROM} {where} "
                "ORDER BY t.created_at DESC, t.id",
                {"user": user},
            )
        return [token_record(r) for r in rows]

    def get_token(self, token_id: str) -> TokenRecord:
        with self._read() as tx:
            return self._token(tx, token_id)

    @staticmethod
    def _token(tx: Tx, token_id: str) -> TokenRecord:
        row = tx.one(
            f"SELECT {TOKEN_COLUMNS} FROM {TOKENS_FROM} WHERE t.id = :id", {"id": token_id}
        )
        if row is None:
            raise NotFound(f"no token '{token_id}'")
        return token_record(row)

    def revoke_token(self, token_id: str, actor: str) -> TokenRecord:
        """Revoke a token for good; one already revoked is returned as it is."""
        with self._write() as tx:
            token = self._token(tx, token_id)
            # compare-and-set: of two revocations at once, one is recorded
            if tx.execute(
                "UPDATE tokens SET revoked_at = :now WHERE id = :id AND revoked_at IS NULL",
                {"now": utcnow(), "id": token_id},
            ):
                append_event(tx, actor, "token.revoke", user=token.user, token_id=token_id)
            return self._token(tx, token_id)

    def authenticate(self, token_hash: str, at: datetime) -> tuple[UserRecord, TokenRecord] | None:
        """The user and token whose hash this is, if the token is neither revoked nor expired
        at `at`; None otherwise. One indexed read: it runs on every API request. The token's
        last use is written apart, at most once a minute, and never fails the request."""
        with self._read() as tx:
            row = tx.one(
                f"SELECT {USER_COLUMNS}, {TOKEN_COLUMNS} FROM {TOKENS_FROM} "
                "WHERE t.hash = :hash AND t.revoked_at IS NULL "
                "AND (t.expires_at IS NULL OR t.expires_at > :at)",
                {"hash": token_hash, "at": at},
            )
        if row is None:
            return None
        user, token = user_record(row), token_record(row)
        if token.last_used_at is None or token.last_used_at < at - LAST_USED_EVERY:
            # a busy or failing store must not turn a valid token away: the time can wait
            with suppress(StoreError), self._write() as tx:
                tx.execute(
                    "UPDATE tokens SET last_used_at = :at WHERE id = :id "
                    "AND (last_used_at IS NULL OR last_used_at < :at)",
                    {"at": at, "id": token.id},
                )
        return user, token

    def token_refusal(self, token_hash: str, at: datetime) -> str:
        """Why authenticate() found no user for this hash at `at`: unknown, revoked or
        expired. For the server's log and metrics; the client is not told which."""
        with self._read() as tx:
            row = tx.one(
                "SELECT revoked_at, expires_at FROM tokens WHERE hash = :hash",
                {"hash": token_hash},
            )
        if row is None:
            return "unknown"
        if row["revoked_at"] is not None:
            return "revoked"
        expires_at = read_time(row["expires_at"])
        return "expired" if expires_at is not None and expires_at <= at else "unknown"

    def bootstrap_admin(self, *, name: str, token_hash: str, actor: str) -> UserRecord | None:
        """The first admin, with a token named `bootstrap`, if the store has no users at all;
        None if it has any. Check and insert hold the users lock, so of two servers starting
        together on one store, one creates the admin."""
        check_user_name(name)
        with self._write() as tx:
            lock_users(tx)
            if tx.scalar("SELECT count(*) FROM users"):
                return None
            user = self._insert_user(tx, name, Role.ADMIN.value, actor)
            self._insert_token(
                tx,
                user.id,
                name,
                token_hash=token_hash,
                name="bootstrap",
                expires_at=None,
                actor=actor,
            )
        return user
