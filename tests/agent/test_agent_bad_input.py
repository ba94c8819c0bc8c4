"""What the agent gateway does with messages it must refuse, against a real `orbit server` on
SQLite and PostgreSQL, spoken to with httpx as an agent would (or as something pretending to
be one). Every refusal is a problem+json answer with a one-line detail that says what was
wrong, and changes nothing: the nodes, their command queues, the attempts and join tokens in
the store, and the control plane's copy of the attempts' files, are as they were."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from orbit.model.config import Settings
from orbit.store import Store
from orbit.wire import protocol as p
from tests.agent.test_pool_runs import ended, run_of, submit
from tests.agents import AgentProc, control, join_token, wait_online
from tests.helpers import eventually, orbit
from tests.orbit_server import Server

AGENT_BYTES = 256 * 1024  # limits.agent_bytes of the server here
INFO = {"agent_version": "test"}


@dataclass
class Node:
    """A node registered by hand: its id, name and credential."""

    id: str
    name: str
    credential: str
    session: str


class Gate:
    """Speaks the agent protocol to a server, as an agent would."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.http = httpx.Client(
            base_url=server.url + p.PREFIX,
            headers={p.VERSION_HEADER: str(p.PROTOCOL_VERSION)},
            timeout=30,
        )
        self.settings = Settings(home=server.home, database_url=server.database_url)

    def post(
        self,
        path: str,
        body: dict[str, Any] | bytes,
        node: Node | None = None,
        *,
        credential: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        more = {"content-type": "application/json", **(headers or {})}
        if node is not None or credential is not None:
            more["authorization"] = f"Bearer {credential or (node and node.credential)}"
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.http.post(path, content=content, headers=more)

    def register(self, name: str, token: str, max_tasks: int = 1) -> Node:
        answer = self.post(
            "/register", {"join_token": token, "name": name, "max_tasks": max_tasks, "info": INFO}
        )
        assert answer.status_code == 201, answer.text
        data = answer.json()
        node = Node(data["node_id"], name, data["credential"], uuid.uuid4().hex)
        synced = self.post("/sync", {"node_id": node.id, "session": node.session}, node)
        assert synced.status_code == 200, synced.text
        return node

    def report(self, node: Node, seq: int, attempts: list[dict[str, Any]]) -> httpx.Response:
        body = {"node_id": node.id, "session": node.session, "seq": seq, "attempts": attempts}
        return self.post("/report", body, node)

    def snapshot(self) -> dict[str, Any]:
        """What a refused message must not change. Last-seen times are left out: a node's own
        requests, refused or not, say that it lives."""
        store = Store(self.server.database_url)
        try:
            with store.db.transaction(write=False) as tx:
                found: dict[str, Any] = {
                    "nodes": tx.all(
                        "SELECT id, name, credential_hash, labels, info, state, max_tasks, "
                        "session, report_seq FROM nodes ORDER BY id"
                    ),
                    "commands": tx.all(
                        "SELECT id, node_id, kind, acked_at, done_at FROM node_commands "
                        "ORDER BY seq"
                    ),
                    "attempts": tx.all(
                        "SELECT id, state, node_id, fence, node_claimed_at FROM attempts "
                        "ORDER BY id"
                    ),
                    "join_tokens": tx.all(
                        "SELECT id, uses, revoked_at FROM join_tokens ORDER BY id"
                    ),
                }
        finally:
            store.close()
        found["files"] = _tree(self.settings.artifacts_dir)
        return found

    def last_seen(self, node: Node) -> Any:
        service = control(self.server)
        try:
            return service.get_node(node.id).last_seen_at
        finally:
            service.close()


def _tree(root: Path) -> dict[str, bytes]:
    if not root.is_dir():
        return {}
    return {
        str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()
    }


def refused(answer: httpx.Response, status: int, *words: str) -> str:
    """The answer is a problem+json `status` with a one-line detail saying `words`."""
    assert answer.status_code == status, (answer.status_code, answer.text)
    assert answer.headers["content-type"].startswith("application/problem+json"), answer.headers
    problem = answer.json()
    detail = str(problem["detail"])
    assert problem["status"] == status and detail and "\n" not in detail, problem
    for word in words:
        assert word in detail, (word, detail)
    return detail


def chunk(path: str, data: bytes, offset: int = 0, **more: Any) -> dict[str, Any]:
    return {"path": path, "offset": offset, "data": base64.b64encode(data).decode(), **more}


@pytest.fixture
def server(
    start_server: Callable[..., Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Server:
    config = tmp_path / "server.yaml"
    config.write_text(f"limits:\n  agent_bytes: {AGENT_BYTES}\n")
    monkeypatch.setenv("ORBIT_NODE_HEARTBEAT_S", "1")
    # nothing here is lost for silence: the hand-made nodes beat only when the test says
    return start_server("--config", str(config), env={"ORBIT_NODE_OFFLINE_S": "600"})


@pytest.fixture
def gate(server: Server) -> Iterator[Gate]:
    gate = Gate(server)
    yield gate
    gate.http.close()


@dataclass
class Placed:
    """A pool run's attempt placed on node `a` and granted its start there; node `b` idle."""

    a: Node
    b: Node
    run_id: str
    attempt_id: str
    fence: int


@pytest.fixture
def placed(server: Server, gate: Gate, tmp_path: Path) -> Placed:
    token = join_token(server)
    a = gate.register("node-a", token)
    b = gate.register("node-b", token, max_tasks=0)  # drained: the run goes to a
    run_id = submit(server, tmp_path, "echo never runs")
    answer = gate.post("/poll", {"node_id": a.id, "session": a.session, "wait_s": 20}, a)
    assert answer.status_code == 200, answer.text
    (command,) = answer.json()["commands"]
    start = command["body"]
    assert start["kind"] == "start" and start["run_id"] == run_id
    acked = gate.post(
        "/poll", {"node_id": a.id, "session": a.session, "acks": [command["id"]], "wait_s": 0}, a
    )
    assert acked.status_code == 200 and acked.json()["commands"] == [], acked.text
    claim = {"node_id": a.id, "attempt_id": start["attempt_id"], "fence": start["fence"]}
    assert gate.post("/claim", claim, a).json() == {"granted": True, "why": ""}
    # the server has seen the start granted: from here the attempt stays as it is
    eventually(lambda: run_of(server, run_id)["attempts"][-1]["state"] == "starting", 30)
    return Placed(a, b, run_id, start["attempt_id"], start["fence"])


# --- who is calling ------------------------------------------------------------------------


def test_a_wrong_or_revoked_credential_is_refused_at_once(
    server: Server, gate: Gate, placed: Placed
) -> None:
    a = placed.a
    beat = {"node_id": a.id, "session": a.session}
    before = gate.snapshot()
    for credential in ("orbitnode_nope", a.credential + "x", a.credential[:-1]):
        refused(gate.post("/heartbeat", beat, credential=credential), 401, "not accepted")
    refused(gate.post("/heartbeat", beat), 401, "Bearer")  # no header at all
    for header in ("Bearer", "Basic " + base64.b64encode(b"a:b").decode(), a.credential):
        refused(gate.post("/heartbeat", beat, headers={"authorization": header}), 401, "Bearer")
    refused(gate.http.get("/bundles/" + "0" * 64), 401)
    assert gate.snapshot() == before

    assert gate.post("/heartbeat", beat, a).status_code == 200
    service = control(server)
    try:
        service.revoke_node(a.name)
    finally:
        service.close()
    # the very next request is refused: nothing is cached on the way
    for path, body in (
        ("/heartbeat", beat),
        ("/poll", {**beat, "wait_s": 0}),
        ("/sync", beat),
        ("/claim", {"node_id": a.id, "attempt_id": placed.attempt_id, "fence": placed.fence}),
        ("/report", {**beat, "seq": 1}),
    ):
        refused(gate.post(path, body, a), 401, "revoked")
    with gate.http.stream(
        "GET", "/bundles/" + "0" * 64, headers={"authorization": f"Bearer {a.credential}"}
    ) as answer:
        answer.read()
        refused(answer, 401, "revoked")
    # and what it ran is lost (to be retried elsewhere)
    first = eventually(lambda: _ended_attempt(server, placed.run_id, 1), 30)
    assert (first["state"], first["reason"]) == ("failed", "node_lost"), first
    assert "revoked" in first["message"], first


def test_an_expired_or_unknown_join_token_registers_nothing(server: Server, gate: Gate) -> None:
    service = control(server)
    try:
        expiring = service.create_join_token(expires="1s").token
    finally:
        service.close()
    time.sleep(1.5)
    before = gate.snapshot()
    body = {"join_token": expiring, "name": "late", "info": INFO}
    refused(gate.post("/register", body), 409, "expired")
    unknown = {**body, "join_token": "orbitjoin_" + "x" * 40}
    refused(gate.post("/register", unknown), 409, "not known")
    assert gate.snapshot() == before  # no node, and the tokens' use counts as they were


def test_a_node_cannot_act_for_another(server: Server, gate: Gate, placed: Placed) -> None:
    a, b = placed.a, placed.b
    time.sleep(1.5)  # the server writes last-seen times once a second
    seen_b = gate.last_seen(b)
    before = gate.snapshot()
    as_b = {"node_id": b.id, "session": a.session}
    attempt = {"attempt_id": placed.attempt_id, "fence": placed.fence}
    report = {
        **attempt,
        "alive": False,
        "ended": True,
        "chunks": [chunk("artifacts/training.log", b"forged\n")],
    }
    for path, body in (
        ("/heartbeat", as_b),
        ("/poll", {**as_b, "wait_s": 0}),
        ("/sync", {**as_b, "session": b.session}),
        ("/report", {**as_b, "seq": 99, "attempts": [report]}),
        ("/claim", {"node_id": b.id, **attempt}),
        ("/claim", {"node_id": b.id, **attempt, "refuse": "forged refusal"}),
        (
            "/transfers",
            {"node_id": b.id, "transfer_id": "cmd-" + "0" * 32, "error": "forged"},
        ),
    ):
        refused(gate.post(path, body, a), 401, b.id)
    time.sleep(1.5)
    assert gate.snapshot() == before
    assert gate.last_seen(b) == seen_b
    # and what A does as itself still works
    own = gate.report(a, 1, [{**report, "chunks": [chunk("artifacts/training.log", b"real\n")]}])
    assert own.status_code == 200, own.text
    log = gate.settings.artifacts_dir / placed.attempt_id / "artifacts" / "training.log"
    assert log.read_bytes() == b"real\n"


def test_another_protocol_version_is_refused_before_the_message_is_read(
    gate: Gate, placed: Placed
) -> None:
    a = placed.a
    before = gate.snapshot()
    beat = {"node_id": a.id, "session": a.session}
    for version in (str(p.PROTOCOL_VERSION + 1), "1", "0", "one", ""):
        headers = {p.VERSION_HEADER: version}
        refused(gate.post("/heartbeat", beat, a, headers=headers), 409, "protocol")
        # whatever the body holds: it is not parsed
        refused(gate.post("/report", b"{not json", a, headers=headers), 409, "protocol")
        register = {"join_token": "orbitjoin_x", "name": "v", "info": INFO}
        refused(gate.post("/register", register, headers=headers), 409, "protocol")
        # the credential is checked first: a stranger learns nothing of the protocol
        refused(gate.post("/heartbeat", beat, credential="bad", headers=headers), 401)
    bare = httpx.post(
        gate.server.url + p.PREFIX + "/heartbeat",
        json=beat,
        headers={"authorization": f"Bearer {a.credential}"},
    )
    refused(bare, 409, f"protocol {p.PROTOCOL_VERSION}", "none")
    assert gate.snapshot() == before


# --- what a message may hold -----------------------------------------------------------------


def test_malformed_messages_are_refused_naming_the_field(gate: Gate, placed: Placed) -> None:
    a = placed.a
    time.sleep(1.5)
    before = gate.snapshot()
    beat = {"node_id": a.id, "session": a.session}
    good = {**beat, "seq": 1, "attempts": []}
    attempt = {"attempt_id": placed.attempt_id, "fence": placed.fence, "alive": True}
    cases: list[tuple[str, dict[str, Any] | bytes, int, tuple[str, ...]]] = [
        ("/report", b'{"node_id": ', 400, ("body", "JSON")),
        ("/report", b"\xff\xfe", 400, ("body",)),
        ("/report", b"[]", 422, ()),
        ("/report", {**good, "bogus": 1}, 422, ("bogus", "unknown field")),
        ("/report", {k: v for k, v in good.items() if k != "seq"}, 422, ("seq",)),
        ("/report", {**good, "seq": 0}, 422, ("seq",)),
        ("/report", {**good, "seq": "many"}, 422, ("seq",)),
        ("/report", {**good, "attempts": [{**attempt, "extra": 1}]}, 422, ("attempts.0.extra",)),
        (
            "/report",
            {**good, "attempts": [{**attempt, "chunks": [{"path": "runtime/x", "offset": -1}]}]},
            422,
            ("attempts.0.chunks.0.offset",),
        ),
        (
            "/report",
            {
                **good,
                "attempts": [{**attempt, "chunks": [{**chunk("runtime/x", b""), "data": "%"}]}],
            },
            422,
            ("runtime/x", "base64"),
        ),
        ("/poll", {**beat, "wait_s": 3600}, 422, ("wait_s",)),
        ("/heartbeat", {**beat, "info": {"agent_version": "x", "gpus": 8}}, 422, ("info.gpus",)),
        ("/claim", {"node_id": a.id, "attempt_id": placed.attempt_id}, 422, ("fence",)),
        ("/sync", {**beat, "running": [{"attempt_id": "x"}]}, 422, ("running.0.fence",)),
        (
            "/register",
            {"join_token": "orbitjoin_x", "name": "bad name!", "info": INFO},
            422,
            ("name",),
        ),
        (
            "/register",
            {"join_token": "orbitjoin_x", "name": "n", "info": INFO, "labels": {"a b": "c"}},
            422,
            ("labels", "a b"),
        ),
    ]
    for path, body, status, words in cases:
        node = None if path == "/register" else a
        refused(gate.post(path, body, node), status, *words)
    # too large: refused before it is read, whatever it holds
    big = chunk("artifacts/training.log", b"x" * AGENT_BYTES)
    huge = {**good, "attempts": [{**attempt, "chunks": [big]}]}
    refused(gate.post("/report", huge, a), 413, "limits.agent_bytes")
    # and sent without a Content-Length, as it arrives
    stream = iter([json.dumps(huge).encode()[i : i + 65536] for i in range(0, 400_000, 65536)])
    answer = gate.http.post(
        "/report",
        content=stream,
        headers={"authorization": f"Bearer {a.credential}", "content-type": "application/json"},
    )
    refused(answer, 413, "limits.agent_bytes")
    # registering needs no credential: it gets no more room than any anonymous request
    padded = {"join_token": "orbitjoin_x", "name": "n", "info": INFO, "pad": "x" * (2 << 20)}
    refused(gate.post("/register", padded), 413, "limits.body_bytes")
    time.sleep(1.5)
    assert gate.snapshot() == before


def test_report_chunks_outside_the_attempt_are_refused_and_nothing_is_written(
    gate: Gate, placed: Placed
) -> None:
    a = placed.a
    folder = gate.settings.artifacts_dir / placed.attempt_id
    home = gate.server.home
    attempt = {"attempt_id": placed.attempt_id, "fence": placed.fence, "alive": True}
    good = chunk("artifacts/training.log", b"line 1\n")
    before = gate.snapshot()
    outside = [
        ("runtime/../../x", 422, ("runtime/../../x",)),
        ("artifacts/../../../x", 422, ("artifacts/../../../x",)),
        ("runtime/a/../../../../x", 422, ("runtime/a/../../../../x",)),
        ("/etc/passwd", 422, ("path",)),
        ("x", 422, ("path",)),
        ("runtime/\x00", 422, ("path",)),
        ("artifacts/..", 422, ("artifacts/..",)),
        ("runtime", 422, ("path",)),
    ]
    for path, status, words in outside:
        # the bad chunk alone, and after a good one: the whole report is refused
        for chunks in ([chunk(path, b"pwned")], [good, chunk(path, b"pwned")]):
            answer = gate.report(a, 1, [{**attempt, "chunks": chunks}])
            refused(answer, status, *words)
            assert gate.snapshot() == before, path
    for where in (home / "x", home.parent / "x", gate.settings.artifacts_dir / "x", Path("/x")):
        assert not where.exists(), where
    # a link planted in the copy is not followed either
    (folder / "artifacts").mkdir(parents=True, exist_ok=True)
    (folder / "artifacts" / "out").symlink_to(home)
    answer = gate.report(a, 1, [{**attempt, "chunks": [chunk("artifacts/out/x", b"pwned")]}])
    refused(answer, 422, "artifacts/out/x")
    assert not (home / "x").exists()
    (folder / "artifacts" / "out").unlink()
    # nothing of the refused reports counted: the same number, well formed, is applied
    answer = gate.report(a, 1, [{**attempt, "chunks": [good]}])
    assert answer.status_code == 200, answer.text
    assert answer.json()["seq"] == 1 and answer.json()["wants"] == [], answer.text
    assert (folder / "artifacts" / "training.log").read_bytes() == b"line 1\n"


def test_a_file_whose_sha256_does_not_match_is_asked_for_again_from_the_start(
    gate: Gate, placed: Placed
) -> None:
    a = placed.a
    folder = gate.settings.artifacts_dir / placed.attempt_id
    target = folder / "artifacts" / "weights.bin"
    data = b"0123456789" * 1000
    attempt = {"attempt_id": placed.attempt_id, "fence": placed.fence, "alive": False}
    seal = {"size": len(data), "sha256": hashlib.sha256(b"something else").hexdigest()}
    # in two parts, the second sealing the file with a sha256 it does not have
    first = gate.report(
        a, 1, [{**attempt, "chunks": [chunk("artifacts/weights.bin", data[:6000])]}]
    )
    assert first.json()["wants"] == [], first.text
    assert target.read_bytes() == data[:6000]
    last = chunk("artifacts/weights.bin", data[6000:], offset=6000, **seal)
    answer = gate.report(a, 2, [{**attempt, "ended": True, "done": True, "chunks": [last]}])
    assert answer.status_code == 200, answer.text
    assert answer.json()["wants"] == [
        {"attempt_id": placed.attempt_id, "path": "artifacts/weights.bin", "offset": 0}
    ]
    assert not target.exists()  # the wrong copy is not kept
    state = json.loads((folder / "agent.json").read_text())
    assert not state.get("complete"), state  # and the attempt's files are not taken as complete
    # the whole file again, with its true sha256: kept, and complete
    again = chunk(
        "artifacts/weights.bin", data, size=len(data), sha256=hashlib.sha256(data).hexdigest()
    )
    answer = gate.report(a, 3, [{**attempt, "ended": True, "done": True, "chunks": [again]}])
    assert answer.json()["wants"] == [], answer.text
    assert target.read_bytes() == data
    assert json.loads((folder / "agent.json").read_text())["complete"] is True


# --- a bundle that is not what its digest says ---------------------------------------------------


def test_a_bundle_archive_that_does_not_match_its_digest_is_made_again_or_fails_staging(
    server: Server,
    start_agent: Callable[..., AgentProc],
    tmp_path: Path,
) -> None:
    agent = start_agent(server, "stager")
    wait_online(server, "stager")
    retry = {"max_retries": 1, "backoff_s": 0}
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first = submit(server, tmp_path / "one", "echo one", retry=retry)
    other = submit(server, tmp_path / "two", "echo two", retry=retry)
    for run_id in (first, other):
        last = ended(server, run_id)["attempts"][-1]
        assert last["state"] == "succeeded", (
            [(a["state"], a["reason"], a["message"]) for a in run_of(server, run_id)["attempts"]],
            agent.output(),
        )
    digest, wrong = (run_of(server, r)["bundle_digest"] for r in (first, other))
    assert digest != wrong
    archives = server.home / "bundle-archives"
    env = server.env()

    # The server's cached archive of the first bundle holds the second's (a disk's fault),
    # and the node has no copy left: the agent finds the bytes do not match the digest, asks
    # for the archive made afresh from the frozen bundle, and the retry runs.
    agent.kill()
    shutil.copyfile(archives / f"{wrong}.tar", archives / f"{digest}.tar")
    shutil.rmtree(agent.work_dir / "bundles")
    agent.start()
    orbit(env, "retry", first)
    attempt = eventually(lambda: _ended_attempt(server, first, 2), 90, 0.2)
    assert attempt["state"] == "succeeded", (attempt, agent.output())
    assert f"bundle {digest[:12]}" in agent.output() and "made afresh" in agent.output()
    assert orbit(env, "logs", first, "--attempt", "2").stdout == "one\n"

    # The frozen bundle itself no longer matches its digest (and there is no archive of it
    # yet): made afresh, the archive is as wrong, and staging fails (for the retry too), with
    # nothing of it on the node.
    agent.kill()
    frozen = server.home / "bundles" / digest / "job.json"
    frozen.write_text(frozen.read_text().replace("echo one", "echo 1ne"))
    (archives / f"{digest}.tar").unlink()
    shutil.rmtree(agent.work_dir / "bundles")
    agent.start()
    orbit(env, "retry", first)
    run = eventually(lambda: _failed_twice(server, first, 4), 90, 0.2)
    manual, automatic = run["attempts"][2:]
    for attempt in (manual, automatic):
        assert attempt["state"] == "failed", attempt
        assert attempt["reason"] == "staging_failed", attempt
        assert digest[:12] in attempt["message"], attempt
    assert automatic["trigger"] == "auto_retry"
    bundles = agent.work_dir / "bundles"
    assert list(bundles.iterdir()) == []
    assert orbit(env, "logs", first, "--attempt", "3").stdout == ""


def _failed_twice(server: Server, run_id: str, attempts_now: int) -> dict[str, Any] | None:
    run = run_of(server, run_id)
    attempts = run["attempts"]
    done = len(attempts) == attempts_now and attempts[-1]["state"] in (
        "succeeded",
        "failed",
        "terminated",
    )
    return run if done else None


def _ended_attempt(server: Server, run_id: str, number: int) -> dict[str, Any] | None:
    attempt = run_of(server, run_id)["attempts"][number - 1]
    return dict(attempt) if attempt["state"] in ("succeeded", "failed", "terminated") else None


# --- a file whose name cannot travel -------------------------------------------------------------


def test_a_file_whose_name_cannot_travel_stays_on_the_node_and_the_rest_arrives(
    server: Server,
    start_agent: Callable[..., AgentProc],
    tmp_path: Path,
) -> None:
    """A task writes a file whose name is not UTF-8 and one whose path is over the protocol's
    1,000 characters: neither can be put in a report. They stay on the node, the agent says
    so, and everything else of the run, and of the runs after it, arrives."""
    agent = start_agent(server, "names")
    wait_online(server, "names")
    deep = "/".join(["d" * 200] * 6)
    command = (
        'cd "$ORBIT_ARTIFACTS_DIR" && printf bad > "$(printf "bad\\377name")" && '
        f"mkdir -p {deep} && printf deep > {deep}/f && printf ok > ok.txt && echo done"
    )
    (tmp_path / "one").mkdir()
    run_id = submit(server, tmp_path / "one", command)
    attempt = ended(server, run_id)["attempts"][-1]
    assert attempt["state"] == "succeeded", (attempt, agent.output())
    env = server.env()
    assert orbit(env, "logs", run_id).stdout == "done\n"
    mirror = server.home / "artifacts" / attempt["id"] / "artifacts"
    assert eventually(lambda: (mirror / "ok.txt").is_file(), 30, 0.1)
    assert (mirror / "ok.txt").read_text() == "ok"
    assert not any(p.name.startswith("bad") for p in mirror.iterdir())
    output = agent.output()
    assert "not uploaded, its name is not UTF-8" in output
    assert "not uploaded, its path is over 1,000 characters" in output
    # the node's reports still flow: the next run's logs arrive
    (tmp_path / "two").mkdir()
    second = submit(server, tmp_path / "two", "echo again")
    assert ended(server, second)["attempts"][-1]["state"] == "succeeded", agent.output()
    assert orbit(env, "logs", second).stdout == "again\n"


def test_a_bundle_the_server_cannot_serve_for_a_while_is_waited_for_not_failed(
    server: Server,
    start_agent: Callable[..., AgentProc],
    tmp_path: Path,
) -> None:
    """The server fails to serve a bundle for a while (5xx: here its archive folder is
    blocked by a file; a restart or a store away looks alike to the agent): the agent asks
    again, and the attempt starts once it can, instead of failing as staging_failed."""
    agent = start_agent(server, "patient")
    wait_online(server, "patient")
    archives = server.home / "bundle-archives"
    shutil.rmtree(archives, ignore_errors=True)
    archives.write_text("in the way")
    run_id = submit(server, tmp_path, "echo staged")
    eventually(lambda: "again" in agent.output() and "fetching bundle" in agent.output(), 30, 0.1)
    archives.unlink()
    run = ended(server, run_id)
    assert [a["state"] for a in run["attempts"]] == ["succeeded"], (run, agent.output())
    assert orbit(server.env(), "logs", run_id).stdout == "staged\n"


def test_a_report_that_fails_half_way_is_applied_when_sent_again(
    gate: Gate, placed: Placed
) -> None:
    """The server fails writing a report's files (here a folder stands where it writes
    result.json before putting it in place; a full disk looks alike): the report is answered
    500, saying what failed, and does not count, so the agent's resend of the same number is
    applied, not taken for a duplicate. That matters most for an attempt's last report:
    nothing follows it."""
    a = placed.a
    folder = gate.settings.artifacts_dir / placed.attempt_id
    (folder / "runtime" / ".result.json.part").mkdir(parents=True)
    result = b'{"state": "succeeded", "exit_code": 0}'
    attempt = {"attempt_id": placed.attempt_id, "fence": placed.fence, "alive": False}
    chunks = [chunk("runtime/result.json", result, replace=True)]
    last = [{**attempt, "ended": True, "done": True, "chunks": chunks}]
    answer = gate.report(a, 1, last)
    assert answer.status_code == 500, answer.text
    assert "the server could not write runtime/result.json" in answer.json()["detail"]
    (folder / "runtime" / ".result.json.part").rmdir()
    answer = gate.report(a, 1, last)  # the same report, sent again
    assert answer.status_code == 200, answer.text
    assert answer.json()["wants"] == [], answer.text
    assert (folder / "runtime" / "result.json").read_bytes() == result
    assert json.loads((folder / "agent.json").read_text())["complete"] is True
    # once applied, the same number again changes nothing
    (folder / "runtime" / "result.json").write_bytes(b"changed here")
    assert gate.report(a, 1, last).status_code == 200
    assert (folder / "runtime" / "result.json").read_bytes() == b"changed here"


def test_the_nodes_layout_wins_over_the_copys_past(gate: Gate, placed: Placed) -> None:
    """The task wrote artifacts/out, then replaced it by a folder of that name (and the other
    way round): the copy follows, instead of refusing the node's every report."""
    a = placed.a
    folder = gate.settings.artifacts_dir / placed.attempt_id
    attempt = {"attempt_id": placed.attempt_id, "fence": placed.fence, "alive": True}
    steps = [
        [chunk("artifacts/out", b"a file")],
        [chunk("artifacts/out/x", b"now a folder")],
        [chunk("artifacts/out", b"a file again")],
    ]
    for seq, chunks in enumerate(steps, start=1):
        answer = gate.report(a, seq, [{**attempt, "chunks": chunks}])
        assert answer.status_code == 200, answer.text
        if seq == 2:
            assert (folder / "artifacts" / "out" / "x").read_bytes() == b"now a folder"
    assert (folder / "artifacts" / "out").read_bytes() == b"a file again"
