"""Who is who: users and their roles, and API tokens. Pure records and functions (stdlib
and pydantic): the store keeps users and token hashes; what a role allows is
orbit.model.permissions'."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime
from enum import StrEnum

from pydantic import Field

from orbit.model.models import Record


class Role(StrEnum):
    ADMIN = "admin"  # everything, users and hosts included
    MEMBER = "member"  # submits runs, and controls its own
    VIEWER = "viewer"  # reads


TOKEN_PREFIX = "orbit_"  # says what a leaked string is (secret scanners look for prefixes)
TOKEN_BYTES = 32


def new_token(prefix: str = TOKEN_PREFIX) -> str:
    """A new API token (or, with another prefix, a join token or node credential): the
    prefix and 32 random bytes, URL-safe."""
    return prefix + secrets.token_urlsafe(TOKEN_BYTES)


def token_hash(token: str) -> str:
    """What the store keeps of a token: its sha256, hex. A token is 256 random bits, not a
    password, so no slow, salted hash is needed: nothing can be guessed, and the store can
    find a token by its hash in one indexed lookup."""
    return hashlib.sha256(token.encode()).hexdigest()


class UserRecord(Record):
    id: str
    name: str
    role: str  # a built-in Role's value, or a role of the site's (orbit.model.permissions)
    created_at: datetime
    created_by: str


class TokenRecord(Record):
    """A token as the store lists it: never its hash, and never the token itself."""

    id: str
    user: str  # the user's name
    name: str | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None

    def active_at(self, at: datetime) -> bool:
        """Not revoked, and not expired at `at`."""
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > at)


class NewToken(Record):
    """A token just made: the plain token, shown once, and its record."""

    token: str = Field(repr=False)  # kept out of reprs, and so out of logs and tracebacks
    record: TokenRecord
    # its expiry was brought forward to that of the token that made it (a token cannot
    # outlive its maker)
    clamped: bool = False
