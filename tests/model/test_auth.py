"""Roles, tokens and durations: the pure half of authentication."""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime, timedelta

import pytest

from orbit.model.auth import (
    TOKEN_PREFIX,
    NewToken,
    TokenRecord,
    new_token,
    token_hash,
)
from orbit.model.durations import parse_duration
from orbit.model.errors import InvalidInput


def test_a_token_is_the_prefix_and_32_random_urlsafe_bytes() -> None:
    tokens = {new_token() for _ in range(200)}
    assert len(tokens) == 200
    for token in tokens:
        assert token.startswith(TOKEN_PREFIX) and TOKEN_PREFIX == "orbit_"
        body = token.removeprefix(TOKEN_PREFIX)
        assert len(body) == 43  # 32 bytes, base64 without padding
        assert len(base64.urlsafe_b64decode(body + "=")) == 32
    # no position is stuck: every character of the body varies across tokens
    bodies = [t.removeprefix(TOKEN_PREFIX) for t in tokens]
    assert all(len({b[i] for b in bodies}) > 10 for i in range(42))


def test_the_hash_is_the_sha256_hex_of_the_whole_token() -> None:
    token = new_token()
    assert token_hash(token) == hashlib.sha256(token.encode()).hexdigest()
    assert len(token_hash(token)) == 64
    assert token_hash(token) != token_hash(token.removeprefix(TOKEN_PREFIX))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("45m", timedelta(minutes=45)),
        ("3600s", timedelta(hours=1)),
        ("2w", timedelta(weeks=2)),
        (" 1d ", timedelta(days=1)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text, "--expires") == expected


@pytest.mark.parametrize(
    "text", ["", "30", "d", "0d", "0s", "-1d", "1.5h", "1 d", "1y", "30D", "1d2h", "99999999w"]
)
def test_bad_durations_are_refused_naming_the_field(text: str) -> None:
    expected = f"--expires: expected a duration like 30d, 12h or 45m, got {text!r}"
    with pytest.raises(InvalidInput) as raised:
        parse_duration(text, "--expires")
    assert str(raised.value) == expected


def test_a_token_record_is_active_until_revoked_or_expired() -> None:
    now = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
    record = TokenRecord(
        id="tok-1",
        user="alice",
        name=None,
        created_at=now,
        expires_at=now + timedelta(days=1),
        revoked_at=None,
        last_used_at=None,
    )
    assert record.active_at(now)
    assert not record.active_at(now + timedelta(days=1))
    assert record.model_copy(update={"expires_at": None}).active_at(now + timedelta(days=999))
    assert not record.model_copy(update={"revoked_at": now}).active_at(now)
    made = NewToken(token="orbit_secret", record=record)
    assert "orbit_secret" not in repr(made)
