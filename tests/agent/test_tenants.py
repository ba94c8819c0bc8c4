"""Tenants on a shared node, tried as an attacker would: a node's credential writes nothing
the server did not queue for it and downloads only its own runs' bundles; `orbit nodes push`
cannot write the agent's own files; a member's task sees no ORBIT credential, cannot read the
node's identity or another attempt, and cannot change the code another user's run executes
(impossible where tasks run as users of their own, and caught by the digest check before the
next launch where they cannot). Real `orbit server` and `orbit agent` processes on loopback."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orbit.wire import protocol as p
from tests.agents import AgentProc, wait_online
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server

# each xdist worker's agents take task users of their own: a user another worker's agent
# was given back and took again would be counted as one this test's task left running
FIRST_UID = 2_000_000_000 + 100 * int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
UIDS = f"{FIRST_UID}-{FIRST_UID + 9}"


@pytest.fixture(autouse=True)
def _quick_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORBIT_NODE_HEARTBEAT_S", "1")


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder other users may pass through (the test's own tmp_path is root's, 0700): the
    work dir of an agent whose tasks run as users of their own."""
    folder = Path(tempfile.mkdtemp(prefix="orbit-tenants-", dir="/tmp"))
    os.chmod(folder, 0o711)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def member(server: Server, name: str) -> dict[str, str]:
    admin = server.env()
    orbit(admin, "users", "add", name, "--role", "member")
    return server.env(str(orbit_json(admin, "tokens", "create", "--user", name)["token"]))


def submit(env: dict[str, str], folder: Path, command: str, **fields: Any) -> str:
    spec = write_spec(folder, template="pool", task={"command": command}, **fields)
    return str(orbit_json(env, "submit", str(spec))["id"])


def run_of(server: Server, run_id: str) -> dict[str, Any]:
    with server.client() as http:
        return dict(http.get(f"/api/v1/runs/{run_id}").json())


def ended(
    server: Server,
    run_id: str,
    attempts: int = 1,
    timeout: float = 60,
    agent: AgentProc | None = None,
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        run = run_of(server, run_id)
        last = run["attempts"][-1]
        done = last["state"] in ("succeeded", "failed", "terminated")
        return run if done and len(run["attempts"]) >= attempts else None

    try:
        return eventually(check, timeout=timeout, every=0.2)
    except AssertionError:  # CI's log is the only record of a flaky failure: say where it stood
        shown = orbit(server.env(), "runs", "show", run_id, check=False).stdout
        nodes = orbit(server.env(), "nodes", "ls", check=False).stdout
        log = server.output()[-4000:]
        said = agent.output()[-4000:] if agent is not None else ""
        raise AssertionError(
            f"{run_id} did not end:\n{shown}\n{nodes}\nserver log:\n{log}\nagent:\n{said}"
        ) from None


def credential(agent: AgentProc) -> str:
    """The node's own credential, once the agent has written it (just after it joined)."""
    identity = agent.work_dir / "agent-identity.json"
    eventually(identity.exists)
    return str(json.loads(identity.read_text())["credential"])


def node_client(server: Server, agent: AgentProc) -> httpx.Client:
    headers = {
        "Authorization": f"Bearer {credential(agent)}",
        p.VERSION_HEADER: str(p.PROTOCOL_VERSION),
    }
    return httpx.Client(base_url=server.url + p.PREFIX, headers=headers, timeout=30)


def victim_spec(folder: Path) -> Path:
    """A run whose code is a staged script saying 'original'."""
    work = folder / "victim"
    work.mkdir(parents=True, exist_ok=True)
    (work / "victim.sh").write_text("echo original\n")
    return write_spec(
        folder,
        "victim.yaml",
        template="pool",
        task={"command": "sh victim.sh", "workdir": "victim"},
        retry={"max_retries": 2, "backoff_s": 0},
    )


def logs(env: dict[str, str], run_id: str, attempt: int) -> str:
    return orbit(env, "logs", run_id, "--attempt", str(attempt), check=False).stdout


def test_a_node_credential_writes_nothing_the_server_did_not_queue_for_it(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    a = start_agent(orbit_server, "gpu-a")
    b = start_agent(orbit_server, "gpu-b")
    wait_online(orbit_server, "gpu-a", "gpu-b")
    run_id = submit(orbit_server.env(), tmp_path, "echo on b", overrides={"target": "gpu-b"})
    victim = ended(orbit_server, run_id)["attempts"][-1]
    assert victim["state"] == "succeeded", b.output()
    data = base64.b64encode(b"evil").decode()
    sha = hashlib.sha256(b"evil").hexdigest()
    home = orbit_server.home
    with node_client(orbit_server, a) as http:
        node_id = orbit_json(orbit_server.env(), "nodes", "show", "gpu-a")["id"]
        # a path for an id: into the other run's artifacts, or anywhere the server may write
        for transfer_id, status in (
            (f"../../artifacts/{victim['id']}/artifacts/evil", 422),
            (str(tmp_path / "evil"), 422),
            ("cmd-" + "0" * 32, 404),  # the shape of an id, but none queued for this node
        ):
            body = {"node_id": node_id, "transfer_id": transfer_id, "data": data, "sha256": sha}
            answer = http.post("/transfers", json=body)
            assert answer.status_code == status, (transfer_id, answer.text)
            assert http.get(f"/transfers/{transfer_id.replace('/', '%2F')}").status_code in (
                404,
                422,
            )
        pulled = [str(f) for f in home.rglob("*.pulled")] + [str(f) for f in tmp_path.glob("evil*")]
        assert pulled == []
        # another node's run's bundle is not this node's to download
        digest = run_of(orbit_server, run_id)["bundle_digest"]
        refused = http.get(f"/bundles/{digest}")
        assert refused.status_code == 403, refused.text
        assert "runs no attempt of bundle" in refused.json()["detail"]


def test_nodes_push_cannot_write_the_agents_own_files_and_keeps_a_files_mode(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    agent = start_agent(orbit_server, "gpu-a")
    wait_online(orbit_server, "gpu-a")
    admin = orbit_server.env()
    payload = tmp_path / "payload"
    payload.write_text("#!/bin/sh\necho pushed\n")
    credential(agent)  # joined
    identity = (agent.work_dir / "agent-identity.json").read_bytes()
    for dest in ("agent-identity.json", "bundles/x/job.json", "attempts/x/inputs/a", "join-token"):
        refused = orbit(admin, "nodes", "push", "gpu-a", str(payload), dest, check=False)
        assert refused.returncode != 0 and "Traceback" not in refused.stderr
        assert "is the agent's own" in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    assert (agent.work_dir / "agent-identity.json").read_bytes() == identity
    assert not (agent.work_dir / "bundles" / "x").exists()
    pulled = orbit(admin, "nodes", "pull", "gpu-a", "agent-identity.json", check=False)
    assert pulled.returncode != 0 and "stays on the node" in pulled.stderr
    assert credential(agent) not in pulled.stdout + pulled.stderr
    # a file pushed over one that is executable stays executable
    orbit(admin, "nodes", "push", "gpu-a", str(payload), "tools/run.sh")
    on_node = agent.work_dir / "tools" / "run.sh"
    os.chmod(on_node, 0o750)
    orbit(admin, "nodes", "push", "gpu-a", str(payload), "tools/run.sh")
    assert stat.S_IMODE(on_node.stat().st_mode) == 0o750


ATTACK = (
    "echo uid=$(id -u); env | grep -i -e token -e credential -e orbitjoin -e orbitnode; "
    "top=$ORBIT_BUNDLE_DIR/../..; "
    "cat $top/agent-identity.json && echo READ-IDENTITY; "
    "ls $top/bundles && echo LISTED-BUNDLES; "
    "for f in $top/bundles/*/inputs/workdir/victim.sh; do "
    "  echo 'echo PWNED' > $f && echo WROTE-CACHE; done; "
    "ls $ORBIT_BUNDLE_DIR/.. && echo LISTED-ATTEMPTS; "
    "cat $ORBIT_BUNDLE_DIR/../{victim}/artifacts/training.log && echo READ-OTHER; "
    "echo x > $ORBIT_BUNDLE_DIR/../{victim}/artifacts/planted && echo WROTE-OTHER; "
    "echo scratch > $TMPDIR/mine; echo shared > /tmp/orbit-tenants-left-{victim}; "
    # links for the agent to follow when it uploads the artifacts (as root)
    "ln -s $top/agent-identity.json $ORBIT_ARTIFACTS_DIR/identity.json; "
    "ln -s $top $ORBIT_ARTIFACTS_DIR/node; "
    "sleep 300 & echo done"
)


def assert_collects_no_credential(
    env: dict[str, str], run_id: str, agent: AgentProc, dest: Path
) -> None:
    """What the agent uploaded of the attack's artifacts holds nothing of what the links
    left there point to."""
    orbit(env, "collect", run_id, "--dest", str(dest), check=False)
    secret = credential(agent).encode()
    # (the task's own log holds what the task could read itself: where it shares the
    # agent's user, the credential too; that is what users of their own are for)
    found = [
        f
        for f in dest.rglob("*")
        if f.is_file() and f.name != "training.log" and secret in f.read_bytes()
    ]
    assert found == [] and not (dest / "identity.json").exists() and not (dest / "node").exists()


def test_a_task_as_a_user_of_its_own_reaches_no_credential_no_cache_no_other_attempt(
    orbit_server: Server,
    start_agent: Callable[..., AgentProc],
    tmp_path: Path,
    open_dir: Path,
) -> None:
    agent = start_agent(
        orbit_server,
        "gpu-a",
        task_uids=UIDS,
        work_dir=open_dir / "agent",
        env={"ORBIT_JOIN_TOKEN": "orbitjoin_in-the-agents-environment"},
    )
    wait_online(orbit_server, "gpu-a")
    eventually(lambda: "tasks run as users of their own" in agent.output())
    bob, eve = member(orbit_server, "bob"), member(orbit_server, "eve")
    victim = str(orbit_json(bob, "submit", str(victim_spec(tmp_path)))["id"])
    first = ended(orbit_server, victim, agent=agent)["attempts"][-1]
    assert first["state"] == "succeeded", (first, agent.output()[-3000:])
    assert logs(bob, victim, 1).strip() == "original"
    attack = submit(eve, tmp_path, ATTACK.format(victim=first["id"]))
    done = ended(orbit_server, attack)["attempts"][-1]
    assert done["state"] == "succeeded", done
    said = logs(eve, attack, 1)
    uid = int(said.split("uid=")[1].split()[0])
    assert FIRST_UID <= uid < FIRST_UID + 10, said
    for leak in ("orbitjoin_", "orbitnode_", "READ-IDENTITY", "LISTED-BUNDLES", "WROTE-CACHE"):
        assert leak not in said, said
    for leak in ("LISTED-ATTEMPTS", "READ-OTHER", "WROTE-OTHER", "original"):
        assert leak not in said, said
    assert "Permission denied" in said and said.rstrip().endswith("done")
    # its end took everything of its user: the process it left, its file in /tmp, its folder
    folder = agent.work_dir / "attempts" / done["id"]
    eventually(lambda: stat.S_IMODE(folder.stat().st_mode) == 0o700, 20)
    assert folder.stat().st_uid == 0 and folder.stat().st_gid == 0
    assert not _processes_of(uid)
    assert not Path(f"/tmp/orbit-tenants-left-{first['id']}").exists()
    assert_collects_no_credential(eve, attack, agent, tmp_path / "collected")
    # the victim's next attempt runs what was frozen
    orbit(bob, "retry", victim)
    again = ended(orbit_server, victim, attempts=2)["attempts"][-1]
    assert again["state"] == "succeeded", again
    assert logs(bob, victim, 2).strip() == "original"


def test_a_cached_bundle_changed_by_a_task_is_never_run_and_is_fetched_again(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    """Where tasks share the agent's user (--task-uids none), a task can write the cache:
    the next launch of that bundle checks it against its digest, fails staging (naming the
    change), drops it, and the automatic retry runs the bundle fetched anew."""
    agent = start_agent(orbit_server, "gpu-a", task_uids="none")
    wait_online(orbit_server, "gpu-a")
    eventually(lambda: "tasks run as this agent's own user" in agent.output())
    bob, eve = member(orbit_server, "bob"), member(orbit_server, "eve")
    victim = str(orbit_json(bob, "submit", str(victim_spec(tmp_path)))["id"])
    first = ended(orbit_server, victim)["attempts"][-1]
    assert first["state"] == "succeeded"
    attack = submit(eve, tmp_path, ATTACK.format(victim=first["id"]))
    said = ended(orbit_server, attack)["attempts"][-1]
    assert "WROTE-CACHE" in logs(eve, attack, 1), said
    assert "READ-IDENTITY" in logs(eve, attack, 1)  # the same user: why users of their own
    assert_collects_no_credential(eve, attack, agent, tmp_path / "collected")
    orbit(bob, "retry", victim)
    run = ended(orbit_server, victim, attempts=3)
    second, third = run["attempts"][1], run["attempts"][2]
    assert (second["state"], second["reason"]) == ("failed", "staging_failed"), second
    assert "was changed after it was staged" in second["message"], second["message"]
    assert third["state"] == "succeeded", third
    assert logs(bob, victim, 3).strip() == "original"
    assert "PWNED" not in logs(bob, victim, 2) + logs(bob, victim, 3)


def test_no_orbit_credential_reaches_a_task_of_an_agent_that_got_one(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    """Even where tasks run as the agent's user: nothing of ORBIT's credentials in their
    environment (ORBIT_JOIN_TOKEN given to the agent, ORBIT_TOKEN in its shell), and the
    agent's own command line holds no token."""
    agent = start_agent(
        orbit_server,
        "gpu-a",
        env={"ORBIT_JOIN_TOKEN": "orbitjoin_x", "ORBIT_TOKEN": "orbit_x", "KEEP_ME": "1"},
    )
    wait_online(orbit_server, "gpu-a")
    run_id = submit(orbit_server.env(), tmp_path, "env")
    assert ended(orbit_server, run_id)["attempts"][-1]["state"] == "succeeded"
    said = orbit(orbit_server.env(), "logs", run_id).stdout
    assert "KEEP_ME=1" in said and "ORBIT_ATTEMPT_ID=" in said
    assert "orbitjoin_" not in said and "orbit_x" not in said and "ORBIT_TOKEN" not in said
    argv = Path(f"/proc/{agent.pid}/cmdline").read_bytes().split(b"\0")
    assert not any(b"orbitjoin_" in arg for arg in argv), argv
    # joined: the agent keeps its own credential, readable by its user alone
    identity = agent.work_dir / "agent-identity.json"
    assert stat.S_IMODE(identity.stat().st_mode) == 0o600
    assert stat.S_IMODE((agent.work_dir / "bundles").stat().st_mode) == 0o700


def _processes_of(uid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            # a process killed and not yet reaped by pid 1 (its parent, being an orphan)
            # is a zombie: it runs nothing, and pid 1 takes its time on a loaded machine
            if fields["State"].split()[0] not in ("Z", "X") and str(uid) in fields["Uid"].split():
                found.append(int(entry.name))
    return found


def test_a_retry_on_the_same_node_takes_no_link_its_task_left_in_a_checkpoint(
    orbit_server: Server,
    start_agent: Callable[..., AgentProc],
    tmp_path: Path,
    open_dir: Path,
) -> None:
    """The agent (root) copies an earlier attempt's checkpoint from its own folder for a retry
    on the same node: a link the task left in it (to the node's credential) is not followed,
    so the retry's task, as its own user, cannot read through it what its user could not."""
    agent = start_agent(orbit_server, "gpu-a", task_uids=UIDS, work_dir=open_dir / "agent")
    wait_online(orbit_server, "gpu-a")
    command = (
        'if [ -z "$ORBIT_RESUME_FROM" ]; then '
        "  mkdir -p $ORBIT_ARTIFACTS_DIR/checkpoints/step-50; "
        "  echo weights > $ORBIT_ARTIFACTS_DIR/checkpoints/step-50/w; "
        "  ln -s $ORBIT_BUNDLE_DIR/../../agent-identity.json "
        "    $ORBIT_ARTIFACTS_DIR/checkpoints/step-50/x; exit 3; "
        "fi; ls $ORBIT_RESUME_FROM; cat $ORBIT_RESUME_FROM/w; cat $ORBIT_RESUME_FROM/x; echo end"
    )
    eve = member(orbit_server, "eve")
    run_id = submit(
        eve,
        tmp_path,
        command,
        overrides={"target": "gpu-a"},
        retry={"max_retries": 1, "backoff_s": 0, "on_exit_codes": [3]},
    )
    ended(orbit_server, run_id, attempts=2)
    said = logs(eve, run_id, 2)
    assert "weights" in said and said.rstrip().endswith("end"), said
    assert credential(agent) not in said and "orbitnode_" not in said, said


def test_a_task_that_stops_its_wrapper_and_blocks_its_stop_request_is_still_cancelled(
    orbit_server: Server,
    start_agent: Callable[..., AgentProc],
    tmp_path: Path,
    open_dir: Path,
) -> None:
    """A task with its own user can freeze its wrapper and leave a fifo where the agent
    writes the stop request: the agent neither hangs nor trusts the wrapper, and once the
    grace is over every process of the attempt's user is killed. The node goes on working."""
    start_agent(orbit_server, "gpu-a", task_uids=UIDS, work_dir=open_dir / "agent")
    wait_online(orbit_server, "gpu-a")
    command = (
        "mkfifo $ORBIT_BUNDLE_DIR/runtime/stop_request.json; trap '' TERM; "
        "echo id=$(id -u); kill -STOP $PPID; sleep 600"
    )
    run_id = submit(orbit_server.env(), tmp_path, command, overrides={"stop_grace_s": 1})
    eventually(lambda: "id=" in logs(orbit_server.env(), run_id, 1), 60)
    uid = int(logs(orbit_server.env(), run_id, 1).split("id=")[1].split()[0])
    assert _processes_of(uid)
    orbit(orbit_server.env(), "cancel", run_id, check=False)
    eventually(lambda: not _processes_of(uid), 60)
    assert ended(orbit_server, run_id)["attempts"][-1]["state"] in ("terminated", "failed")
    after = submit(orbit_server.env(), tmp_path, "echo still working")
    assert ended(orbit_server, after)["attempts"][-1]["state"] == "succeeded"


def test_a_task_user_whose_last_process_waits_to_be_reaped_is_free_again(tmp_path: Path) -> None:
    """A task's orphan killed at its attempt's end is a zombie until pid 1 reaps it, which a
    loaded machine puts off for seconds: that dead process keeps no user taken, while a live
    one does."""
    from orbit.agent.isolation import TaskUsers

    uid = FIRST_UID + 50
    users = TaskUsers(range(uid, uid + 1))
    child = os.fork()
    if child == 0:  # pragma: no cover (the child)
        os.setuid(uid)
        signal.pause()
    try:
        eventually(lambda: str(uid) in Path(f"/proc/{child}/status").read_text(), 10)
        with pytest.raises(RuntimeError, match="no free task uid"):
            users.take("alive")
        os.kill(child, signal.SIGKILL)
        eventually(lambda: "zombie" in Path(f"/proc/{child}/status").read_text(), 10)
        assert users.take("after") == uid  # the zombie still there: nothing reaped it yet
        users.give_back("after", tmp_path)
        assert Path(f"/proc/{child}").exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
