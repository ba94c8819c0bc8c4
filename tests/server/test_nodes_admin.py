"""`orbit nodes` as an admin runs it: a real `orbit server` process, the real CLI, and nodes
that join by the agent protocol's own requests (made here with httpx, as `orbit agent` would).
Join tokens, drain, cordon, set, revoke, remove, push and pull; who may do which; the one-line
errors; and that no token or credential is ever kept or audited as it was shown."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from orbit.store import Store
from orbit.store.tables import Base
from orbit.wire.protocol import PREFIX, PROTOCOL_VERSION, VERSION_HEADER
from tests.agents import AgentProc, wait_online
from tests.helpers import ORBIT, eventually, orbit, orbit_json
from tests.orbit_server import Server

AGENT = {VERSION_HEADER: str(PROTOCOL_VERSION)}
H100 = "NVIDIA H100 80GB HBM3"
INFO: dict[str, Any] = {
    "agent_version": "0.9.1",
    "hostname": "gpu-a.lab",
    "accelerators": [
        {
            "index": i,
            "uuid": f"GPU-{i}0000000-1111-2222-3333-444444444444",
            "model": H100,
            "memory_mb": 81559,
            "nvlink_peers": [1 - i],
        }
        for i in range(2)
    ],
    "accelerator_source": "nvml",
    "cpus": 64,
    "memory_mb": 512 * 1024,
    "disk_free_mb": 900 * 1024,
    "docker": True,
    "nvidia_runtime": True,
    "cached_models": ["llama-3-8b"],
    "cached_datasets": ["c4-mini"],
}


def one_line_error(proc: subprocess.CompletedProcess[str], code: int, *says: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orbit: error: "), proc.stderr
    for text in says:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def register(
    server: Server, join_token: str, name: str, labels: dict[str, str] | None = None, **more: Any
) -> httpx.Response:
    body = {"join_token": join_token, "name": name, "labels": labels or {}, "info": INFO, **more}
    return httpx.post(f"{server.url}{PREFIX}/register", json=body, headers=AGENT, timeout=30)


class Node:
    """A node joined by hand: its credential, and the agent requests it makes."""

    def __init__(self, server: Server, joined: dict[str, Any]) -> None:
        self.server, self.id, self.name = server, joined["node_id"], joined["name"]
        self.session = uuid.uuid4().hex
        self.http = httpx.Client(
            base_url=server.url,
            headers={**AGENT, "Authorization": f"Bearer {joined['credential']}"},
            timeout=30,
        )

    def heartbeat(self) -> httpx.Response:
        body = {"node_id": self.id, "session": self.session}
        return self.http.post(f"{PREFIX}/heartbeat", json=body)

    def close(self) -> None:
        self.http.close()


def join(server: Server, token: str, name: str, **more: Any) -> Node:
    answer = register(server, token, name, **more)
    assert answer.status_code == 201, answer.text
    return Node(server, answer.json())


def token_for(server: Server, user: str, role: str) -> str:
    admin = server.env()
    orbit(admin, "users", "add", user, "--role", role)
    return str(orbit_json(admin, "tokens", "create", "--user", user)["token"])


# what a member or viewer is refused, and the permission each needs
WHAT = (
    "make and revoke agents' join tokens: that needs the permission nodes.join",
    "drain, label, revoke and remove nodes: that needs the permission nodes.manage",
    "push files to nodes and pull files from them: that needs the permission nodes.files",
)


def dump_store(url: str) -> str:
    """Every row of every table, as text."""
    store = Store(url)
    try:
        with store.db.transaction(write=False) as tx:
            rows = {t: tx.all(f"SELECT * FROM {t}") for t in Base.metadata.tables}
    finally:
        store.close()
    return json.dumps(
        {t: [{k: str(v) for k, v in r.items()} for r in rs] for t, rs in rows.items()}
    )


@pytest.fixture
def orbit_server(start_server: Callable[..., Server]) -> Server:
    """A server that judges a node online for an hour after it was last seen: nodes here join
    and fall silent, and must read as they were left however slow the machine (a node's
    condition is the server's judgement, by its offline timeout)."""
    return start_server(env={"ORBIT_NODE_OFFLINE_S": "3600"})


@pytest.fixture
def admin(orbit_server: Server) -> dict[str, str]:
    """The admin's CLI environment."""
    return orbit_server.env()


def test_a_node_joins_and_an_admin_drains_cordons_and_sets_it(
    orbit_server: Server, admin: dict[str, str], store_url: str
) -> None:
    made = orbit_json(
        admin, "nodes", "join-token", "create", "--labels", "zone=b,gpu=h100", "--expires", "1d"
    )
    token = made["token"]
    assert token.startswith("orbitjoin_") and made["labels"] == {"zone": "b", "gpu": "h100"}
    assert made["uses"] == 0 and made["expires_at"] and made["created_by"] == "admin"
    node = join(orbit_server, token, "gpu-a", labels={"rack": "r1", "zone": "c"}, max_tasks=2)
    try:
        # listed, with the token's labels under its own
        (listed,) = orbit_json(admin, "nodes", "list")
        assert listed["name"] == "gpu-a" and listed["id"] == node.id
        assert listed["labels"] == {"zone": "c", "gpu": "h100", "rack": "r1"}
        assert listed["condition"] == "ready" and listed["online"] is True
        assert listed["max_tasks"] == 2 and listed["running"] == [] and listed["state"] == "active"
        table = orbit(admin, "nodes", "list").stdout
        header, row = table.splitlines()
        assert header.split() == [
            "NAME", "CONDITION", "RUNNING", "GPUS", "CPUS", "MEM", "LAST", "SEEN", "LABELS",
            "REASON",
        ]  # fmt: skip
        for cell in ("gpu-a", "ready", "0/2", "2x H100 80GB HBM3", "64", "512 GiB", "s ago"):
            assert cell in row, (cell, row)
        assert row.endswith("gpu=h100,rack=r1,zone=c  -")

        shown = orbit(admin, "nodes", "show", "gpu-a").stdout
        for text in (
            node.id,
            f"0.9.1 (protocol {PROTOCOL_VERSION}) on gpu-a.lab",
            "GPU-00000000-1111-2222-3333-444444444444",
            "nvlink peers 1",
            "80 GiB",
            "900 GiB in the agent's work dir",
            "docker:          yes, nvidia runtime yes",
            "llama-3-8b",
            "c4-mini",
            "found by nvml",
        ):
            assert text in shown, (text, shown)
        by_id = orbit_json(admin, "nodes", "show", node.id)
        assert by_id["info"]["accelerators"][1]["nvlink_peers"] == [0]
        assert by_id["info"]["cached_models"] == ["llama-3-8b"]

        # drain: no new work, and (nothing running) free for people at once
        drained = orbit(admin, "nodes", "drain", "gpu-a").stdout
        assert "draining gpu-a: it takes no new work" in drained
        assert "free for people" in drained and "--max-tasks 2" in drained
        shown_json = orbit_json(admin, "nodes", "show", "gpu-a")
        assert shown_json["max_tasks"] == 0
        assert shown_json["condition"] == "drained (free for people)"
        assert "drained (free for people)" in orbit(admin, "nodes", "list").stdout
        assert "0/0" in orbit(admin, "nodes", "list").stdout

        assert orbit_json(admin, "nodes", "set", "gpu-a", "--max-tasks", "3")["max_tasks"] == 3
        assert orbit_json(admin, "nodes", "show", "gpu-a")["condition"] == "ready"

        cordoned = orbit(admin, "nodes", "cordon", "gpu-a").stdout
        assert "cordoned gpu-a: it takes no new work; what runs there goes on" in cordoned
        after = orbit_json(admin, "nodes", "show", "gpu-a")
        assert after["state"] == "cordoned" and after["condition"] == "cordoned (free)"
        assert after["max_tasks"] == 3  # kept: uncordon gives it back as it was
        assert orbit_json(admin, "nodes", "uncordon", "gpu-a")["condition"] == "ready"

        # an agent's heartbeat hears the new settings
        assert node.heartbeat().json() == {
            "heartbeat_s": 5.0,
            "max_tasks": 3,
            "state": "active",
            "resync": False,
            "fence_after_s": 3615.0,  # the lost timeout: offline after 3600 s, 15 s of grace
        }

        # mistakes: one line, exit 2, nothing changed
        one_line_error(orbit(admin, "nodes", "set", "gpu-a", check=False), 2, "--max-tasks")
        one_line_error(
            orbit(admin, "nodes", "set", "gpu-a", "--max-tasks", "2000", check=False),
            2,
            "--max-tasks: expected 0 to 1024, got 2000",
        )
        one_line_error(orbit(admin, "nodes", "drain", "gpu-zz", check=False), 2, "no node 'gpu-zz'")
        assert orbit_json(admin, "nodes", "show", "gpu-a")["max_tasks"] == 3

        # the token was used once; its list never shows it
        (listed_token,) = orbit_json(admin, "nodes", "join-token", "list")
        assert listed_token["id"] == made["id"] and listed_token["uses"] == 1
        assert "token" not in listed_token
        assert "active" in orbit(admin, "nodes", "join-token", "list").stdout

        # the audit names who did what, and never holds the token
        events = orbit_json(admin, "audit")
        actions = [(e["actor"], e["action"]) for e in events]
        assert ("admin", "join_token.create") in actions
        assert ("node:gpu-a", "node.register") in actions
        assert actions.count(("admin", "node.update")) == 4  # drain, set, cordon, uncordon
        audit_text = orbit(admin, "audit", "--json").stdout
        assert token not in audit_text
        dumped = dump_store(store_url)
        assert made["id"] in dumped and token not in dumped
        assert hashlib.sha256(token.encode()).hexdigest() in dumped  # kept as its hash only
    finally:
        node.close()


def test_members_and_viewers_may_read_nodes_and_nothing_more(
    orbit_server: Server, admin: dict[str, str]
) -> None:
    token = orbit_json(admin, "nodes", "join-token", "create")["token"]
    join(orbit_server, token, "gpu-a").close()
    for user, role in (("mia", "member"), ("vic", "viewer")):
        secret = token_for(orbit_server, user, role)
        env = orbit_server.env(secret)
        assert [n["name"] for n in orbit_json(env, "nodes", "list")] == ["gpu-a"]
        assert orbit_json(env, "nodes", "show", "gpu-a")["condition"] == "ready"
        joins, manage, files = (f"{user} ({role}) may not {what}" for what in WHAT)
        for args, denied in (
            (["nodes", "join-token", "create"], joins),
            (["nodes", "join-token", "list"], joins),
            (["nodes", "drain", "gpu-a"], manage),
            (["nodes", "cordon", "gpu-a"], manage),
            (["nodes", "revoke", "gpu-a"], manage),
            (["nodes", "remove", "gpu-a"], manage),
            (["nodes", "pull", "gpu-a", "x"], files),
        ):
            one_line_error(orbit(env, *args, check=False), 2, denied)
        with orbit_server.client(secret) as http:
            made = http.post("/api/v1/nodes/join-tokens", json={"labels": {}})
            assert made.status_code == 403, made.text
            assert made.json()["detail"] == joins
            drain = http.post("/api/v1/nodes/gpu-a", json={"max_tasks": 0})
            assert drain.status_code == 403, drain.text
            assert http.get("/api/v1/nodes").status_code == 200
    # nothing they tried took: still one join token, the node as it joined
    assert len(orbit_json(admin, "nodes", "join-token", "list")) == 1
    (node,) = orbit_json(admin, "nodes", "list")
    assert node["max_tasks"] == 1 and node["state"] == "active"


def test_revoke_locks_the_node_out_and_remove_forgets_it(
    orbit_server: Server, admin: dict[str, str]
) -> None:
    token = orbit_json(admin, "nodes", "join-token", "create")["token"]
    node = join(orbit_server, token, "gpu-a")
    try:
        assert node.heartbeat().status_code == 200
        said = orbit(admin, "nodes", "revoke", "gpu-a").stdout
        assert "revoked gpu-a: its agent is refused from now on" in said
        refused = node.heartbeat()
        assert refused.status_code == 401, refused.text
        assert refused.json()["detail"] == "node 'gpu-a' was revoked"
        assert orbit_json(admin, "nodes", "show", "gpu-a")["condition"] == "revoked"
        assert "revoked" in orbit(admin, "nodes", "list").stdout
        one_line_error(
            orbit(admin, "nodes", "uncordon", "gpu-a", check=False),
            2,
            "node 'gpu-a' is revoked: remove it and let it join again",
        )
        # the name is taken until the node is removed
        again = register(orbit_server, token, "gpu-a")
        assert again.status_code == 422 and "already registered" in again.json()["detail"]

        assert orbit(admin, "nodes", "remove", "gpu-a").stdout == "removed node gpu-a\n"
        assert orbit_json(admin, "nodes", "list") == []
        assert node.heartbeat().status_code == 401
        for args in (["remove", "gpu-a"], ["show", "gpu-a"], ["remove", "gpu-a", "--force"]):
            one_line_error(
                orbit(admin, "nodes", *args, check=False),
                2,
                "no node 'gpu-a' (see `orbit nodes list`)",
            )
        # ... and it may join again, as a new node
        back = join(orbit_server, token, "gpu-a")
        assert back.id != node.id and back.heartbeat().status_code == 200
        removed = orbit_json(admin, "nodes", "remove", back.id, "--force")
        assert removed["name"] == "gpu-a"
        back.close()
        events = [e for e in orbit_json(admin, "audit") if e["action"].startswith("node.")]
        assert [e["action"] for e in events] == [
            "node.register", "node.update", "node.remove", "node.register", "node.remove"
        ]  # fmt: skip
        assert events[1]["data"]["state"] == "revoked" and events[1]["actor"] == "admin"
    finally:
        node.close()


def test_a_node_cannot_be_named_like_the_join_tokens_path(
    orbit_server: Server, admin: dict[str, str]
) -> None:
    """/nodes/join-tokens is the join tokens' route: no node may take that name."""
    token = orbit_json(admin, "nodes", "join-token", "create")["token"]
    refused = register(orbit_server, token, "join-tokens")
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"] == (
        "name: 'join-tokens' is reserved; give the node another --name"
    )
    assert orbit_json(admin, "nodes", "list") == []


def test_join_tokens_expire_and_are_revoked(orbit_server: Server, admin: dict[str, str]) -> None:
    short = orbit_json(admin, "nodes", "join-token", "create", "--expires", "2s")
    long = orbit_json(admin, "nodes", "join-token", "create")
    time.sleep(2.2)
    expired = register(orbit_server, short["token"], "gpu-a")
    assert expired.status_code == 409, expired.text
    assert expired.json()["detail"].startswith(f"join token {short['id']} expired at ")
    said = orbit(admin, "nodes", "join-token", "revoke", long["id"]).stdout
    assert said == f"revoked join token {long['id']}\n"
    revoked = register(orbit_server, long["token"], "gpu-a")
    assert revoked.status_code == 409
    assert revoked.json()["detail"] == f"join token {long['id']} was revoked"
    unknown = register(orbit_server, "orbitjoin_nope", "gpu-a")
    assert unknown.status_code == 409
    assert unknown.json()["detail"] == "the join token is not known to this server"
    states = {
        row.split()[0]: row.split()[1]
        for row in orbit(admin, "nodes", "join-token", "list").stdout.splitlines()[1:]
    }
    assert states == {short["id"]: "expired", long["id"]: "revoked"}
    assert orbit_json(admin, "nodes", "list") == []  # nobody joined
    one_line_error(
        orbit(admin, "nodes", "join-token", "revoke", "join-nope", check=False),
        2,
        "no join token 'join-nope'",
    )
    one_line_error(
        orbit(admin, "nodes", "join-token", "create", "--expires", "soon", check=False),
        2,
        "--expires",
    )


@pytest.fixture
def agent(
    orbit_server: Server, admin: dict[str, str], start_agent: Callable[..., AgentProc]
) -> AgentProc:
    """A real `orbit agent` named gpu-a; its work dir is where pushes land and pulls read."""
    token = orbit_json(admin, "nodes", "join-token", "create")["token"]
    proc = start_agent(orbit_server, "gpu-a", token=token)
    wait_online(orbit_server, "gpu-a")
    return proc


def cli(
    env: dict[str, str], *args: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*ORBIT, *args], env=env, input=stdin, capture_output=True, timeout=120)


def lines(proc: subprocess.CompletedProcess[bytes]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stderr.decode() + proc.stdout.decode()


# orbit.store.node_commands.pending_commands hands a command's body on as the store returns it:
# text on SQLite (a JSON column is TEXT there), which the gateway's poll cannot read (a 500)


def test_push_and_pull_move_files_through_the_agent(
    orbit_server: Server, admin: dict[str, str], agent: AgentProc, tmp_path: Path
) -> None:
    payload = os.urandom(3 * 1024 * 1024) + b"\x00end"
    (tmp_path / "weights.bin").write_bytes(payload)
    said = cli(admin, "nodes", "push", "gpu-a", str(tmp_path / "weights.bin"), "in/w.bin")
    assert lines(said) == f"pushed {len(payload):,} bytes to gpu-a:in/w.bin\n"
    assert (agent.work_dir / "in" / "w.bin").read_bytes() == payload
    # from stdin, and as JSON
    piped = cli(admin, "nodes", "push", "gpu-a", "-", "notes.txt", "--json", stdin=b"hi\n")
    assert json.loads(lines(piped))["size"] == 3
    assert (agent.work_dir / "notes.txt").read_bytes() == b"hi\n"

    out = tmp_path / "back.bin"
    pulled = cli(admin, "nodes", "pull", "gpu-a", "in/w.bin", "-o", str(out))
    assert lines(pulled) == f"pulled {len(payload):,} bytes from gpu-a:in/w.bin to {out}\n"
    assert out.read_bytes() == payload
    to_stdout = cli(admin, "nodes", "pull", "gpu-a", "notes.txt")
    assert to_stdout.returncode == 0 and to_stdout.stdout == b"hi\n"

    # what the node refuses, and what never reaches it: one line each
    one_line_error(
        orbit(admin, "nodes", "pull", "gpu-a", "nowhere.txt", check=False),
        2,
        "node 'gpu-a': pull of nowhere.txt: nowhere.txt: no such file",
    )
    one_line_error(
        orbit(admin, "nodes", "push", "gpu-a", str(tmp_path / "missing"), "x", check=False),
        2,
        "missing: No such file or directory",
    )
    one_line_error(
        orbit(admin, "nodes", "push", "gpu-b", str(tmp_path / "weights.bin"), "x", check=False),
        2,
        "no node 'gpu-b'",
    )
    big = tmp_path / "big.bin"
    with big.open("wb") as file:
        file.truncate(48 * 1024 * 1024 + 1)
    one_line_error(
        orbit(admin, "nodes", "push", "gpu-a", str(big), "big.bin", check=False),
        2,
        "larger than a push takes (50,331,648 bytes)",
    )
    with orbit_server.client() as http:
        with big.open("rb") as file:  # a byte too many: the route says so
            answer = http.post(
                "/api/v1/nodes/gpu-a/push", data={"dest": "big.bin"}, files={"file": file}
            )
        assert answer.status_code == 422, answer.text
        assert answer.json()["detail"] == "file: at most 50,331,648 bytes per push"
        with big.open("ab") as file:
            file.truncate(49 * 1024 * 1024)
        with big.open("rb") as file:  # past the form's slack too: refused before it is read
            answer = http.post(
                "/api/v1/nodes/gpu-a/push", data={"dest": "big.bin"}, files={"file": file}
            )
        assert answer.status_code == 413, answer.text
    assert not (agent.work_dir / "big.bin").exists()
    # nothing leaves the node's work dir
    one_line_error(
        orbit(admin, "nodes", "pull", "gpu-a", "../../etc/passwd", check=False),
        2,
        "is outside the node's work dir",
    )
    events = [e for e in orbit_json(admin, "audit") if e["action"] in ("node.push", "node.pull")]
    assert [(e["action"], e["actor"]) for e in events] == [
        ("node.push", "admin"), ("node.push", "admin"), ("node.pull", "admin"),
        ("node.pull", "admin"),
    ]  # fmt: skip
    assert events[0]["data"] == {"node": "gpu-a", "dest": "in/w.bin", "size": len(payload)}


@pytest.fixture(params=["embedded", "server"])
def env(
    request: pytest.FixtureRequest, orbit_server: Server, orbit_home: Path, store_url: str
) -> dict[str, str]:
    """The CLI embedded (on the server's store, in its own process) or through the server."""
    if request.param == "server":
        return orbit_server.env()
    env = {k: v for k, v in orbit_server.env().items() if k not in ("ORBIT_SERVER", "ORBIT_TOKEN")}
    return {**env, "ORBIT_DATABASE_URL": store_url, "ORBIT_NODE_OFFLINE_S": "3600"}


def test_a_drain_or_cordon_reason_is_shown_audited_and_cleared_when_it_takes_work(
    env: dict[str, str], orbit_server: Server
) -> None:
    token = orbit(env, "nodes", "join-token", "create").stdout.strip()
    join(orbit_server, token, "gpu-a", max_tasks=2).close()
    why = "fan replacement, ticket 4711"
    drained = orbit(env, "nodes", "drain", "gpu-a", "--reason", why).stdout
    (listed,) = orbit_json(env, "nodes", "list")
    actor = listed["reason_by"]  # who drained it: through the server, the token's user
    assert actor == "admin" or "ORBIT_SERVER" not in env
    assert listed["reason"] == why and listed["reason_at"] and listed["max_tasks"] == 0
    assert f"reason: {why} (by {actor}, " in drained
    table = orbit(env, "nodes", "list").stdout
    assert table.splitlines()[0].split()[-1] == "REASON"
    assert table.splitlines()[1].endswith(f"{why} ({actor})")
    assert f"reason:          {why} (by {actor}, " in orbit(env, "nodes", "show", "gpu-a").stdout

    # set --max-tasks N takes work again: the reason goes; a cordon gives a new one, which
    # is shown as text, never obeyed by the terminal
    assert orbit_json(env, "nodes", "set", "gpu-a", "--max-tasks", "2")["reason"] is None
    odd = "disk\x1b[2J swap"
    cordoned = orbit_json(env, "nodes", "cordon", "gpu-a", "--reason", odd)
    assert cordoned["reason"] == odd and cordoned["condition"] == "cordoned (free)"
    table = orbit(env, "nodes", "list").stdout
    assert "\x1b" not in table and "disk\\x1b[2J swap" in table
    one_line_error(
        orbit(env, "nodes", "drain", "gpu-a", "--reason", "  ", check=False),
        2,
        "--reason: give a few words (1 to 256 characters)",
    )
    assert orbit_json(env, "nodes", "uncordon", "gpu-a")["reason"] is None

    updates = [e for e in orbit_json(env, "audit") if e["action"] == "node.update"]
    assert [(e["actor"], e["data"]) for e in updates] == [
        (actor, {"node": "gpu-a", "max_tasks": 0, "reason": why}),
        (actor, {"node": "gpu-a", "max_tasks": 2, "reason": None}),
        (actor, {"node": "gpu-a", "state": "cordoned", "reason": odd}),
        (actor, {"node": "gpu-a", "state": "active", "reason": None}),
    ]
    eventually(lambda: orbit(env, "nodes", "remove", "gpu-a").returncode == 0)


def test_nodes_embedded_or_through_the_server(
    env: dict[str, str], orbit_server: Server, store_url: str
) -> None:
    """Embedded, the commands work on the store itself: a join token made there lets an
    agent join the server on that store."""
    listed = orbit(env, "nodes", "list")
    assert listed.stdout == "" and "no nodes yet" in listed.stderr
    assert orbit_json(env, "nodes", "list") == []
    made = orbit(env, "nodes", "join-token", "create", "--labels", "gpu=h100")
    token = made.stdout.strip()
    assert token.startswith("orbitjoin_") and len(made.stdout.splitlines()) == 1
    server = env.get("ORBIT_SERVER") or "URL"
    assert f"orbit agent --server {server} --join-token-file FILE" in made.stderr
    assert token not in made.stderr  # the token is on stdout only, not in a command to copy
    node = join(orbit_server, token, "gpu-a")
    node.close()
    (shown,) = orbit_json(env, "nodes", "list")
    assert shown["name"] == "gpu-a" and shown["labels"] == {"gpu": "h100"}
    assert orbit_json(env, "nodes", "drain", "gpu-a")["condition"] == "drained (free for people)"
    assert "gpu-a" in orbit(env, "nodes", "list").stdout
    # Embedded, this shell is the control plane and its offline timeout rules; through the
    # server, the server's does (an hour here), whatever the shell's environment says.
    (judged,) = orbit_json({**env, "ORBIT_NODE_OFFLINE_S": "0.001"}, "nodes", "list")
    through_server = "ORBIT_SERVER" in env
    assert judged["condition"] == ("drained (free for people)" if through_server else "offline")
    assert judged["offline_after_s"] == (3600.0 if through_server else 0.001)

    # bad labels: one line naming --labels, exit 2, no token made
    for labels, says in (
        ("novalue", "--labels: 'novalue': write labels as key=value,key2=value2"),
        ("bad key=v", "--labels: label key 'bad key'"),
        ("k=v v", "--labels: label 'k' value 'v v'"),
    ):
        proc = orbit(env, "nodes", "join-token", "create", "--labels", labels, check=False)
        one_line_error(proc, 2, says)
        assert proc.stdout == ""
    assert len(orbit_json(env, "nodes", "join-token", "list")) == 1
    created = [e for e in orbit_json(env, "audit") if e["action"] == "join_token.create"]
    assert len(created) == 1 and token not in json.dumps(created)
    assert token not in dump_store(store_url)
    eventually(lambda: orbit(env, "nodes", "remove", "gpu-a").returncode == 0)
