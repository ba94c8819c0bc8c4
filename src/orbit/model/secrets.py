"""Secrets as objects: a name, a scope and an owner, a value sealed in the store (never shown:
orbit.model.secret_keys seals it) and when it was set, last rotated and last used.

Scopes: a user's own (`user`, owned by that user), and shared ones an admin sets, for an
experiment (`experiment`, owned by its id) or for everyone (`global`). A run's reference to a
name resolves to the submitter's own secret of that name first, then the experiment's, then
the global one."""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum

from orbit.model.errors import InvalidInput
from orbit.model.models import Record

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")  # an environment variable's shape
MAX_VALUE_BYTES = 64 * 1024


class Scope(StrEnum):
    USER = "user"
    EXPERIMENT = "experiment"
    GLOBAL = "global"


# the order a reference is resolved in: the submitter's own first
RESOLUTION = (Scope.USER, Scope.EXPERIMENT, Scope.GLOBAL)


class SecretRecord(Record):
    """A secret as it is listed: never its value."""

    name: str
    scope: Scope
    owner: str  # the user's name, the experiment's id, or "" for global
    key_id: str  # the key its value is sealed under
    created_at: datetime
    created_by: str
    rotated_at: datetime | None = None  # its value last replaced
    used_at: datetime | None = None  # last delivered to a run


class KeyRotation(Record):
    """What a rotation of the secret keys did: the new key, how many values it re-sealed under
    it, and the keys retired (no value was sealed under them any more)."""

    key_id: str
    resealed: int
    retired: list[str]


def check_name(name: str, field: str = "name") -> str:
    if not NAME.fullmatch(name):
        raise InvalidInput(
            f"{field}: '{name}' is not a secret name (letters, digits and _, not starting "
            "with a digit, at most 128: an environment variable's shape)"
        )
    return name


def check_value(value: bytes, field: str = "value") -> bytes:
    if not value:
        raise InvalidInput(f"{field}: empty; a secret needs a value")
    if len(value) > MAX_VALUE_BYTES:
        raise InvalidInput(f"{field}: {len(value):,} bytes, over the {MAX_VALUE_BYTES:,} allowed")
    if b"\0" in value:
        raise InvalidInput(f"{field}: holds a NUL byte, which no environment variable can")
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"{field}: not UTF-8 text (an environment variable's value)") from None
    return value


def scope_named(text: str) -> Scope:
    try:
        return Scope(text)
    except ValueError:
        raise InvalidInput(
            f"scope: '{text}' is not one of {', '.join(s.value for s in Scope)}"
        ) from None


def bound_to(scope: Scope, owner: str, name: str) -> str:
    """What a value is sealed for (orbit.model.secret_keys): its place, so that a value
    copied onto another secret's row does not open."""
    return f"orbit-secret\0{scope.value}\0{owner}\0{name}"
