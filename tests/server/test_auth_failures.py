"""Tokens cannot outlive their maker, only an admin makes tokens for others, and failed
authentications are counted in /metrics, logged without the credential and limited per
source address, against a real `orbit server`. Other addresses are never held back by one
address's failures; the attacker here really comes from another address (127.0.0.2: all of
127/8 is loopback), as a client elsewhere would."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from tests.helpers import orbit, orbit_json
from tests.orbit_server import Server

WRONG = "orbit_" + "w" * 43  # shaped like a token, known to no server


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def from_elsewhere() -> Iterator[Callable[[Server, str], httpx.Client]]:
    """Clients of a server that connect from another loopback address."""
    made: list[httpx.Client] = []

    def make(server: Server, address: str) -> httpx.Client:
        transport = httpx.HTTPTransport(local_address=address)
        client = httpx.Client(base_url=server.url, transport=transport, timeout=30)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def test_a_token_made_with_a_token_expires_no_later_than_it(orbit_server: Server) -> None:
    admin = orbit_server.env()
    orbit(admin, "users", "add", "mia", "--role", "member")
    maker = orbit_json(admin, "tokens", "create", "--expires", "1h", "--name", "maker")
    env = orbit_server.env(maker["token"])

    longer = orbit_json(env, "tokens", "create", "--expires", "30d")
    forever = orbit_json(env, "tokens", "create", "--user", "mia")  # asks for no expiry
    shorter = orbit_json(env, "tokens", "create", "--expires", "10m")
    assert longer["expires_at"] == forever["expires_at"] == maker["expires_at"]
    assert longer["clamped"] and forever["clamped"] and not shorter["clamped"]
    assert datetime.fromisoformat(shorter["expires_at"]) < datetime.fromisoformat(
        maker["expires_at"]
    )
    said = orbit(env, "tokens", "create", "--expires", "30d")
    until = datetime.fromisoformat(maker["expires_at"])
    assert f"expires {until:%Y-%m-%d %H:%M} UTC (no later than the token that made it)" in (
        said.stderr
    ), said.stderr
    listed = {t["id"]: t for t in orbit_json(admin, "tokens", "list")}
    assert listed[forever["id"]]["expires_at"] == maker["expires_at"]  # so the store keeps it

    # it lives no longer: once a short-lived maker has expired, what it made is refused too
    brief = orbit_json(admin, "tokens", "create", "--expires", "3s")["token"]
    with orbit_server.client(brief) as http:
        made = http.post("/api/v1/tokens", json={"name": "heir"}).json()
    assert made["clamped"] is True
    with orbit_server.client(made["token"]) as http:
        assert http.get("/api/v1/whoami").status_code == 200
        time.sleep(3.2)
        assert http.get("/api/v1/whoami").status_code == 401


def test_only_an_admin_makes_or_revokes_tokens_for_others(orbit_server: Server) -> None:
    admin = orbit_server.env()
    orbit(admin, "users", "add", "mia", "--role", "member")
    orbit(admin, "users", "add", "vic", "--role", "viewer")
    mia = orbit_json(admin, "tokens", "create", "--user", "mia")["token"]
    vic = orbit_json(admin, "tokens", "create", "--user", "vic")["token"]
    before = orbit_json(admin, "tokens", "list")
    admins_token = next(t["id"] for t in before if t["user"] == "admin")
    for token, who in ((mia, "mia (member)"), (vic, "vic (viewer)")):
        for user in ("admin", "nobody-such"):  # an unknown user is no different: 403, not 404
            refused = orbit(
                orbit_server.env(token), "tokens", "create", "--user", user, check=False
            )
            assert refused.returncode == 2
            assert refused.stderr == (
                f"orbit: error: {who} may not add and remove users, and manage anyone's "
                "tokens: that needs the permission users.manage\n"
            )
        with orbit_server.client(token) as http:
            answer = http.delete(f"/api/v1/tokens/{admins_token}")
            assert answer.status_code == 403 and answer.json()["error"] == "Forbidden"
            listed = http.get("/api/v1/tokens", params={"user": "admin"})
            assert listed.status_code == 403
    kept = ("id", "user", "expires_at", "revoked_at")  # last_used_at moves as they are used

    def tokens() -> list[tuple[str, ...]]:
        return [tuple(t[k] for k in kept) for t in orbit_json(admin, "tokens", "list")]

    assert tokens() == [tuple(t[k] for k in kept) for t in before]  # nothing made or revoked
    # each may make their own, and an admin makes them for anyone
    assert orbit_json(orbit_server.env(mia), "tokens", "create")["user"] == "mia"
    assert orbit_json(admin, "tokens", "create", "--user", "vic")["user"] == "vic"


def _limited_server(start_server: Callable[..., Server], tmp_path: Path, **limits: float) -> Server:
    config = tmp_path / "server.yaml"
    config.write_text(json.dumps({"auth_failures": limits}), encoding="utf-8")
    return start_server("--config", str(config))


def test_failed_authentications_are_counted_logged_and_limited_per_source(
    start_server: Callable[..., Server],
    tmp_path: Path,
    from_elsewhere: Callable[[Server, str], httpx.Client],
) -> None:
    server = _limited_server(start_server, tmp_path, burst=5, window_s=60, block_s=3)
    good = _bearer(server.admin_token)
    attacker = from_elsewhere(server, "127.0.0.2")
    for _ in range(5):
        assert attacker.get("/api/v1/runs", headers=_bearer(WRONG)).status_code == 401
    # from now on that address is refused, a good token and a node's route alike, unread
    blocked = attacker.get("/api/v1/whoami", headers=good)
    assert blocked.status_code == 429, blocked.text
    assert 1 <= int(blocked.headers["retry-after"]) <= 3
    assert blocked.headers["content-type"] == "application/problem+json"
    assert "auth_failures" in blocked.json()["detail"]
    assert attacker.post("/api/v1/agent/sync", headers=_bearer(WRONG)).status_code == 429
    assert attacker.get("/healthz").status_code == 200  # open to all, always

    # everyone else goes on as before: a good token from another address
    with server.client() as http:
        assert http.get("/api/v1/whoami").json()["name"] == "admin"
        # a node credential that fails, a revoked token and an expired one, from a third address
        elsewhere = from_elsewhere(server, "127.0.0.3")
        assert elsewhere.post("/api/v1/agent/sync", headers=_bearer(WRONG)).status_code == 401
        revoked = http.post("/api/v1/tokens", json={"name": "gone"}).json()
        http.delete(f"/api/v1/tokens/{revoked['record']['id']}")
        assert elsewhere.get("/api/v1/whoami", headers=_bearer(revoked["token"])).status_code == 401
        expired = http.post("/api/v1/tokens", json={"expires": "1s"}).json()["token"]
        time.sleep(1.1)
        assert elsewhere.get("/api/v1/runs/x", headers=_bearer(expired)).status_code == 401
        assert elsewhere.get("/api/v1/whoami").status_code == 401  # none at all
        text = http.get("/metrics").text
    assert 'orbit_auth_failures_total{kind="user",reason="unknown"} 5.0' in text
    assert 'orbit_auth_failures_total{kind="node",reason="unknown"} 1.0' in text
    assert 'orbit_auth_failures_total{kind="user",reason="revoked"} 1.0' in text
    assert 'orbit_auth_failures_total{kind="user",reason="expired"} 1.0' in text
    assert 'orbit_auth_failures_total{kind="user",reason="missing"} 1.0' in text
    assert "orbit_auth_limited_requests_total 2.0" in text

    # the log says where from, on which route and why; never a credential
    log = server.output()
    said = "authentication failed: user credential unknown, from 127.0.0.2, GET /api/v1/runs"
    assert said in log
    assert "user credential expired, from 127.0.0.3, GET /api/v1/runs/{ref}" in log
    assert "node credential unknown, from 127.0.0.3, POST /api/v1/agent/sync" in log
    assert "refusing every request from 127.0.0.2 for 3 s" in log
    for secret in (WRONG, server.admin_token, revoked["token"], expired):
        assert secret not in log

    # and once the block is over, the address is heard again
    time.sleep(3.1)
    assert attacker.get("/api/v1/whoami", headers=good).status_code == 200


def test_the_limiter_remembers_a_bounded_number_of_addresses(
    start_server: Callable[..., Server],
    tmp_path: Path,
    from_elsewhere: Callable[[Server, str], httpx.Client],
) -> None:
    server = _limited_server(start_server, tmp_path, burst=2, block_s=600, sources=2)
    first = from_elsewhere(server, "127.0.0.2")
    for _ in range(2):
        first.get("/api/v1/runs", headers=_bearer(WRONG))
    assert first.get("/api/v1/runs").status_code == 429
    for address in ("127.0.0.3", "127.0.0.4"):  # two more: the oldest is forgotten
        from_elsewhere(server, address).get("/api/v1/runs", headers=_bearer(WRONG))
    assert first.get("/api/v1/runs", headers=_bearer(server.admin_token)).status_code == 200


def test_the_limiter_alone() -> None:
    from orbit.server.auth_failures import FailureLimiter, source_of
    from orbit.server.config import AuthFailures

    now = [0.0]
    limiter = FailureLimiter(
        AuthFailures(burst=3, window_s=10, block_s=5, sources=100), lambda: now[0]
    )
    assert [limiter.failed("a") for _ in range(3)] == [False, False, True]
    assert limiter.retry_after("a") == 5 and limiter.retry_after("b") is None
    now[0] = 5.0
    assert limiter.retry_after("a") is None  # the block is over, and counting starts again
    assert not limiter.failed("a")
    now[0] = 100.0  # failures further apart than the window never add up
    assert [limiter.failed("c") for _ in range(2)] + [limiter.failed("c")] == [False, False, True]
    for n in range(100_000):
        limiter.failed(f"10.{n // 65536}.{n // 256 % 256}.{n % 256}")
    assert len(limiter) == 100
    # an IPv6 address counts by its /64; an IPv4 one by itself, however it is written
    assert source_of({"client": ("2001:db8::1", 1)}) == source_of({"client": ("2001:db8::2", 1)})
    assert source_of({"client": ("::ffff:10.0.0.1", 1)}) == "10.0.0.1"
