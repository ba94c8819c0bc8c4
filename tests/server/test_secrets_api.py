"""Secrets through a real `orbit server` on both stores, as its users use them: the CLI with
the value on standard input or in a file (never on the command line), the roles (a member keeps
its own, an admin sets shared ones and rotates the keys, a viewer keeps none), no interface
that gives a value back, no value (nor its base64) in the store or the server's files, and a
server that refuses to start, in one line, on a store sealed under keys it lacks."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from orbit.store import Store
from tests.helpers import ORBIT, orbit_json
from tests.orbit_server import Server
from tests.server.test_console import token_for

VALUE = "hf_TopSecretValue_42_ünïcode"


def cli(
    server: Server, token: str, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ORBIT, *args], env=server.env(token), input=stdin, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def every_row(database_url: str) -> str:
    """Every row of every table of the store, as text: what a dump of it holds."""
    store = Store(database_url)
    try:
        with store.db.transaction(write=False) as tx:
            if store.dialect == "sqlite":
                tables = [
                    r["name"] for r in tx.all("SELECT name FROM sqlite_master WHERE type = 'table'")
                ]
            else:
                tables = [
                    r["tablename"]
                    for r in tx.all(
                        "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
                    )
                ]
            rows = [tx.all(f'SELECT * FROM "{t}"', {}) for t in tables]
    finally:
        store.close()
    return json.dumps(rows, default=str, ensure_ascii=False)


def test_members_keep_their_own_admins_the_shared_and_nothing_gives_a_value_back(
    orbit_server: Server, tmp_path: Path
) -> None:
    ann = token_for(orbit_server, "ann", "member")
    bob = token_for(orbit_server, "bob", "member")
    vic = token_for(orbit_server, "vic", "viewer")
    admin = orbit_server.admin_token
    done = cli(orbit_server, ann, "secrets", "set", "hf_token", stdin=VALUE + "\n")
    assert done.returncode == 0 and "set user secret hf_token of ann" in done.stdout, done.stderr
    value_file = tmp_path / "wandb.txt"
    value_file.write_text("wandb-shared-value\n")
    done = cli(
        orbit_server,
        ann,
        "secrets",
        "set",
        "wandb",
        "--scope",
        "global",
        "--value-file",
        str(value_file),
    )
    assert (
        done.returncode == 2
        and "ann (member) may not set and remove experiments' and everyone's secrets" in done.stderr
    )
    assert (
        cli(
            orbit_server,
            admin,
            "secrets",
            "set",
            "wandb",
            "--scope",
            "global",
            "--value-file",
            str(value_file),
        ).returncode
        == 0
    )
    done = cli(orbit_server, vic, "secrets", "set", "mine", stdin="x")
    assert done.returncode == 2 and "vic (viewer) may not keep secrets of their own" in done.stderr
    assert cli(orbit_server, bob, "secrets", "set", "hf_token", stdin="bobs-own").returncode == 0
    # each sees its own and the shared ones; an admin every one; no value anywhere
    listed = {
        (s["name"], s["scope"], s["owner"])
        for s in orbit_json(orbit_server.env(ann), "secrets", "list")
    }
    assert listed == {("hf_token", "user", "ann"), ("wandb", "global", "")}
    everyone = orbit_json(orbit_server.env(admin), "secrets", "list")
    assert len(everyone) == 3 and all("value" not in s and "sealed" not in s for s in everyone)
    # ann's rm is of her own: bob's stays
    assert cli(orbit_server, ann, "secrets", "rm", "hf_token").returncode == 0
    assert [
        s["owner"]
        for s in orbit_json(orbit_server.env(admin), "secrets", "list")
        if s["name"] == "hf_token"
    ] == ["bob"]
    assert cli(orbit_server, ann, "secrets", "set", "hf_token", stdin=VALUE).returncode == 0
    # rotation: admins only; every value re-sealed, the old key retired
    done = cli(orbit_server, ann, "secrets", "rotate-key")
    assert done.returncode == 2 and "permission secrets.rotate" in done.stderr
    done = cli(orbit_server, admin, "secrets", "rotate-key")
    assert done.returncode == 0 and "re-sealed 3 value(s)" in done.stdout, done.stderr
    with orbit_server.client(ann) as http:
        assert http.get("/api/v1/secrets/hf_token").status_code in (404, 405)  # no read-back
        bad = http.put("/api/v1/secrets/hf-token", json={"value": "x"})
        assert bad.status_code == 422 and "name" in bad.text
    # the value, as text and base64, is nowhere the server keeps anything
    dump = every_row(orbit_server.database_url)
    files = "".join(
        p.read_text(errors="replace") for p in orbit_server.home.rglob("*") if p.is_file()
    )
    for text in (dump, files):
        for form in (VALUE, base64.b64encode(VALUE.encode()).decode(), "wandb-shared-value"):
            assert form not in text
    events = [e["action"] for e in orbit_json(orbit_server.env(admin), "audit")]
    assert {"secret.set", "secret.removed", "secret.key_rotated"} <= set(events)


def test_a_server_without_the_stores_keys_refuses_to_start_in_one_line(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    first = start_server()
    assert cli(first, first.admin_token, "secrets", "set", "hf_token", stdin=VALUE).returncode == 0
    kid = orbit_json(first.env(), "secrets", "list")[0]["key_id"]
    first.stop()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "audit-key").write_bytes((first.home / "audit-key").read_bytes())
    argv = [sys.executable, "-m", "orbit", "server", "--database-url", first.database_url]
    proc = subprocess.run(
        [*argv, "--port", "0"], env={**first.env(), "ORBIT_HOME": str(elsewhere)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    said = [line for line in proc.stderr.splitlines() if kid in line]
    assert said and "Traceback" not in proc.stderr, proc.stderr
    assert str(elsewhere / "secret-keys") in said[0]
