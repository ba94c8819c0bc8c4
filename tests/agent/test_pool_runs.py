"""Pool runs as users see them: real `orbit server` and `orbit agent` processes on loopback, the
real CLI, SQLite and PostgreSQL. A pool run does what a local run does (logs, progress,
collect, cancel, retry), waits for a free node, and starts once, on one node, however its
start command is redelivered or its server restarted."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.agents import AgentProc, control, wait_online
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server

# a task that says where it ran, writes progress and an artifact, and counts its executions
TASK = (
    "echo start on $ORBIT_NODE_NAME gpus=[$CUDA_VISIBLE_DEVICES]; "
    "echo $ORBIT_ATTEMPT_ID >> {ledger}; "
    "mkdir -p $ORBIT_ARTIFACTS_DIR/train $ORBIT_ARTIFACTS_DIR/previews; "
    'for i in 1 2 3; do echo "{{\\"step\\": $i, \\"loss\\": 0.$((9-i))}}" '
    ">> $ORBIT_ARTIFACTS_DIR/train/logging.jsonl; done; "
    "echo sample > $ORBIT_ARTIFACTS_DIR/previews/sample.txt; "
    "head -c 300000 /dev/urandom > $ORBIT_ARTIFACTS_DIR/weights.bin; "
    "echo end"
)


def submit(server: Server, folder: Path, command: str, **fields: Any) -> str:
    spec = write_spec(folder, template="pool", task={"command": command}, **fields)
    return str(orbit_json(server.env(), "submit", str(spec))["id"])


def run_of(server: Server, run_id: str) -> dict[str, Any]:
    with server.client() as http:
        return dict(http.get(f"/api/v1/runs/{run_id}").json())


def ended(server: Server, run_id: str, timeout: float = 60) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        run = run_of(server, run_id)
        last = run["attempts"][-1]
        return run if last["state"] in ("succeeded", "failed", "terminated") else None

    try:
        return eventually(check, timeout=timeout, every=0.1)
    except AssertionError:
        last = run_of(server, run_id)["attempts"][-1]
        raise AssertionError(
            f"run {run_id} did not end in {timeout}s: {last['state']}, {last['message']}"
        ) from None


def test_a_pool_run_does_everything_a_local_run_does(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    agent = start_agent(orbit_server, "gpu-a", labels="rack=a")
    wait_online(orbit_server, "gpu-a")
    ledger = tmp_path / "ledger"
    run_id = submit(orbit_server, tmp_path, TASK.format(ledger=ledger))
    run = ended(orbit_server, run_id)
    attempt = run["attempts"][-1]
    assert attempt["state"] == "succeeded", (attempt, agent.output())
    assert attempt["handle"]["target"] == "gpu-a"
    env = orbit_server.env()
    logs = orbit(env, "logs", run_id).stdout
    assert "start on gpu-a gpus=[]" in logs and logs.rstrip().endswith("end")
    # the layered logs and the progress came back too
    assert "wrapper" in orbit(env, "logs", run_id, "--layer", "runtime").stdout.lower()
    layers = {layer["layer"]: layer for layer in orbit_json(env, "inspect", run_id)["layers"]}
    assert layers["precheck"]["verdict"] == "ok"
    assert layers["progress"]["summary"] == "3 logged steps, loss 0.8 -> 0.6"
    assert layers["nvml"]["verdict"] == "absent"  # no GPU here, which the audit says once
    # collect: every artifact, checked against the manifest
    dest = tmp_path / "collected"
    collected = orbit_json(env, "collect", run_id, "--dest", str(dest))
    assert collected["verified"] is True, collected
    assert (dest / "weights.bin").stat().st_size == 300000
    assert (dest / "previews" / "sample.txt").read_text() == "sample\n"
    # the audit says where it was placed and that it started once
    events = orbit_json(env, "audit", "--run", run_id)
    placed = [e for e in events if e["action"] == "attempt.placed"]
    assert len(placed) == 1 and placed[0]["data"]["node"] == "gpu-a"
    assert ledger.read_text().split() == [attempt["id"]]


def test_cancel_reaches_a_running_pool_task_and_retry_runs_it_again(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    agent = start_agent(orbit_server, "gpu-b")
    wait_online(orbit_server, "gpu-b")
    run_id = submit(orbit_server, tmp_path, "echo up; sleep 120")
    eventually(lambda: run_of(orbit_server, run_id)["attempts"][-1]["state"] == "running", 30)
    env = orbit_server.env()
    orbit(env, "cancel", run_id)
    run = ended(orbit_server, run_id, timeout=30)
    assert run["attempts"][-1]["state"] == "terminated"
    assert run["attempts"][-1]["reason"] == "cancelled"
    # nothing of it runs on the node any more
    first = run["attempts"][-1]["id"]
    assert not _marked_processes(first), agent.output()
    orbit(env, "retry", run_id)
    again = eventually(lambda: len(run_of(orbit_server, run_id)["attempts"]) == 2, 10)
    assert again
    eventually(lambda: run_of(orbit_server, run_id)["attempts"][-1]["state"] == "running", 30)
    orbit(env, "cancel", run_id)
    ended(orbit_server, run_id, timeout=30)


def test_runs_wait_for_a_free_node_and_a_drained_node_takes_no_new_work(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    start_agent(orbit_server, "solo", max_tasks=1)
    wait_online(orbit_server, "solo")
    flag = tmp_path / "go"
    first = submit(orbit_server, tmp_path, f"while [ ! -e {flag} ]; do sleep 0.1; done")
    eventually(lambda: run_of(orbit_server, first)["attempts"][-1]["state"] == "running", 30)
    second = submit(orbit_server, tmp_path, "echo second")
    time.sleep(2)
    waiting = run_of(orbit_server, second)["attempts"][-1]
    assert waiting["state"] == "prepared"
    assert waiting["message"] == "0/1 nodes fit: 1 full (1/1 in use)"
    flag.touch()
    assert ended(orbit_server, first)["attempts"][-1]["state"] == "succeeded"
    assert ended(orbit_server, second)["attempts"][-1]["state"] == "succeeded"
    # drained: a new run waits, and the node shows free for people
    service = control(orbit_server)
    try:
        service.set_node("solo", max_tasks=0)
        third = submit(orbit_server, tmp_path, "echo third")
        time.sleep(2)
        assert run_of(orbit_server, third)["attempts"][-1]["state"] == "prepared"
        node = service.get_node("solo")
        from datetime import UTC, datetime

        assert node.condition(datetime.now(UTC)) == "drained (free for people)"
        service.set_node("solo", max_tasks=1)
    finally:
        service.close()
    assert ended(orbit_server, third)["attempts"][-1]["state"] == "succeeded"


def test_a_start_is_never_run_twice_across_server_restarts_and_redeliveries(
    start_server: Callable[..., Server],
    start_agent: Callable[..., AgentProc],
    tmp_path: Path,
) -> None:
    server = start_server()
    a1 = start_agent(server, "n1", max_tasks=4)
    a2 = start_agent(server, "n2", max_tasks=4)
    wait_online(server, "n1", "n2")
    ledger = tmp_path / "ledger"
    runs = [
        submit(server, tmp_path, f"echo $ORBIT_ATTEMPT_ID >> {ledger}; sleep 1") for _ in range(8)
    ]
    time.sleep(0.3)
    server.stop(signal.SIGKILL)  # mid-flight: some starts queued, some claimed, some running
    server = start_server(port=port_of(server))
    for run_id in runs:
        try:
            last = ended(server, run_id, timeout=90)["attempts"][-1]
        except AssertionError:
            for r in runs:
                print(
                    "RUN",
                    [
                        (a["id"], a["state"], a["reason"], a["message"])
                        for a in run_of(server, r)["attempts"]
                    ],
                )
            print(a1.output()[-3000:], a2.output()[-3000:], server.output()[-3000:])
            raise
        assert last["state"] == "succeeded"
    executed = ledger.read_text().split()
    assert len(executed) == len(set(executed)), executed  # no attempt executed twice
    finals = {run_of(server, r)["attempts"][-1]["id"] for r in runs}
    assert finals <= set(executed)


def test_a_pool_launch_cut_by_a_server_crash_is_launched_again_not_failed(
    start_server: Callable[..., Server],
    start_agent: Callable[..., AgentProc],
    tmp_path: Path,
) -> None:
    """The server dies while it launches a pool run, before placing it on a node (held at
    ORBIT's before-launch failpoint). Placing is one transaction, so nothing of the attempt
    exists anywhere: the next server launches that same attempt, instead of ending it as
    staging_failed (a run without retries would end there)."""
    server = start_server(env={"ORBIT_FAILPOINTS": "before-launch=sleep:60"})
    agent = start_agent(server, "n1")
    wait_online(server, "n1")
    ledger = tmp_path / "ledger"
    spec = write_spec(
        tmp_path,
        template="pool",
        task={"command": f"echo $ORBIT_ATTEMPT_ID >> {ledger}; echo ran"},
        retry={"max_retries": 0},
    )
    submitting = threading.Thread(
        target=lambda: orbit(server.env(), "submit", str(spec), check=False), daemon=True
    )
    submitting.start()
    with server.client() as http:

        def held() -> str | None:  # the run exists, its attempt claimed for launching
            runs = http.get("/api/v1/runs").json()["runs"]
            return str(runs[0]["run"]["id"]) if runs else None

        run_id = eventually(held, timeout=30, every=0.05)
    server.stop(signal.SIGKILL)
    submitting.join(timeout=30)
    server = start_server(port=port_of(server))
    run = ended(server, run_id, timeout=90)
    attempts = [(a["state"], a["reason"], a["message"]) for a in run["attempts"]]
    assert [a[0] for a in attempts] == ["succeeded"], (attempts, agent.output()[-2000:])
    assert ledger.read_text().split() == [run["attempts"][0]["id"]]
    assert orbit(server.env(), "logs", run_id).stdout == "ran\n"


def port_of(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def _marked_processes(attempt_id: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and f"ORBIT_ATTEMPT_ID={attempt_id}".encode() in environ:
            found.append(int(entry.name))
    return found


@pytest.fixture(autouse=True)
def _quick_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing here waits on liveness timeouts."""
    monkeypatch.setenv("ORBIT_NODE_HEARTBEAT_S", "1")
