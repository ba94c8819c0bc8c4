"""Runs converge after a node's faults, with real `orbit server` and `orbit agent` processes: a
retry that needs its rebooted node starts when the node is back (pinned, on a full pool, a
gang) and resumes from the newest checkpoint; a node cut off from the server stops its own
attempts before their retries start (the agent, or the wrapper whose agent is gone); collect
says within seconds what cannot come and delivers what is there."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.agent.test_pool_runs import _marked_processes, ended, run_of, submit
from tests.agents import AgentProc, wait_online
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server

QUICK = {
    "ORBIT_NODE_HEARTBEAT_S": "0.5",
    "ORBIT_NODE_OFFLINE_S": "3",
    "ORBIT_NODE_LOST_GRACE_S": "2",
}
RETRY = {"max_retries": 3, "backoff_s": 0.2}
# saves a checkpoint every 0.3 s, says where it resumed from, and when it started and stopped
TRAIN = (
    'echo "start $ORBIT_ATTEMPT_ID $(date +%s.%N)" >> {ledger}; '
    "trap 'echo \"stop $ORBIT_ATTEMPT_ID $(date +%s.%N)\" >> {ledger}; exit 143' TERM; "
    'echo "resume=${{ORBIT_RESUME_FROM:-none}}"; '
    'step=0; [ -n "$ORBIT_RESUME_FROM" ] && step=$(basename $ORBIT_RESUME_FROM | tr -dc 0-9); '
    "mkdir -p $ORBIT_ARTIFACTS_DIR/checkpoints; "
    "while [ $step -lt {steps} ]; do step=$((step+1)); "
    "  echo $step > $ORBIT_ARTIFACTS_DIR/checkpoints/.tmp && "
    "  mv $ORBIT_ARTIFACTS_DIR/checkpoints/.tmp $ORBIT_ARTIFACTS_DIR/checkpoints/step-$step; "
    "  sleep 0.3 & wait; done; echo finished at $step"
)


@pytest.fixture
def quick(start_server: Callable[..., Server]) -> Server:
    return start_server(env=QUICK)


def attempts(server: Server, run_id: str) -> list[dict[str, Any]]:
    return list(run_of(server, run_id)["attempts"])


def reboot(agent: AgentProc, attempt_ids: list[str]) -> None:
    """The node goes down: its agent, wrapper and task all die at once (the work dir stays)."""
    agent.kill(signal.SIGKILL)
    for attempt_id in attempt_ids:
        for pid in _marked_processes(attempt_id):
            os.kill(pid, signal.SIGKILL)
    eventually(lambda: not any(_marked_processes(a) for a in attempt_ids), 10)


def checkpoints(agent: AgentProc, attempt_id: str) -> int:
    folder = agent.work_dir / "attempts" / attempt_id / "artifacts" / "checkpoints"
    steps = [int(p.name.split("-")[1]) for p in folder.glob("step-*")] if folder.is_dir() else []
    return max(steps, default=0)


@pytest.mark.parametrize("case", ["pinned", "full pool"])
def test_a_retry_that_needs_its_rebooted_node_starts_when_it_is_back_and_resumes(
    quick: Server, start_agent: Callable[..., AgentProc], tmp_path: Path, case: str
) -> None:
    ledger = tmp_path / "ledger"
    b = start_agent(quick, "gpu-b", max_tasks=1)
    overrides: dict[str, Any] = {"target": "gpu-b"} if case == "pinned" else {}
    if case == "full pool":  # the other node is busy for the whole test
        start_agent(quick, "gpu-a", max_tasks=1)
        wait_online(quick, "gpu-a", "gpu-b")
        blocker = submit(quick, tmp_path, "sleep 600", overrides={"target": "gpu-a"})
        eventually(lambda: attempts(quick, blocker)[-1]["state"] == "running", 60)
    wait_online(quick, "gpu-b")
    run_id = submit(
        quick, tmp_path, TRAIN.format(ledger=ledger, steps=400), overrides=overrides, retry=RETRY
    )
    eventually(lambda: attempts(quick, run_id)[-1]["state"] == "running", 60)
    first = attempts(quick, run_id)[-1]["id"]
    eventually(lambda: checkpoints(b, first) >= 5, 30)
    reboot(b, [first])
    saved = checkpoints(b, first)
    eventually(lambda: attempts(quick, run_id)[0]["reason"] == "node_lost", 30)
    time.sleep(2)
    waiting = attempts(quick, run_id)[-1]
    assert waiting["state"] == "prepared" and waiting["number"] == 2, waiting
    b.start()  # the node is back, its agent too, with what its disk kept
    eventually(lambda: attempts(quick, run_id)[-1]["state"] == "running", 60)
    second = attempts(quick, run_id)[-1]
    assert second["number"] == 2 and second["handle"]["target"] == "gpu-b"
    log = eventually(
        lambda: "resume=" in (said := orbit(quick.env(), "logs", run_id).stdout) and said
    )
    assert f"checkpoints/step-{saved}" in log, (saved, log)
    orbit(quick.env(), "cancel", run_id)
    ended(quick, run_id)


def test_a_gang_lost_with_its_node_runs_again_once_the_node_is_back(
    quick: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    start_agent(quick, "gpu-a", max_tasks=1)
    b = start_agent(quick, "gpu-b", max_tasks=1)
    wait_online(quick, "gpu-a", "gpu-b")
    run_id = submit(
        quick,
        tmp_path,
        "echo rank $ORBIT_NODE_RANK of $ORBIT_NUM_NODES; sleep 600",
        overrides={"num_nodes": 2},
        retry=RETRY,
    )
    eventually(lambda: attempts(quick, run_id)[-1]["state"] == "running", 60)
    gang = attempts(quick, run_id)[-1]["handle"]["data"]["gang"]
    reboot(b, [m["attempt"] for m in gang if m["node"] == "gpu-b"])
    eventually(lambda: attempts(quick, run_id)[0]["reason"] == "node_lost", 30)
    time.sleep(2)
    assert attempts(quick, run_id)[-1]["state"] == "prepared"  # no rank starts alone
    b.start()
    eventually(lambda: attempts(quick, run_id)[-1]["state"] == "running", 60)
    assert attempts(quick, run_id)[-1]["number"] == 2
    orbit(quick.env(), "cancel", run_id)
    ended(quick, run_id)


def _times(ledger: Path, word: str) -> dict[str, float]:
    found = {}
    for line in ledger.read_text().splitlines():
        said, attempt_id, at = line.split()
        if said == word:
            found[attempt_id] = float(at)
    return found


@pytest.mark.parametrize("cut", ["server frozen", "agent frozen"])
def test_a_node_cut_off_stops_its_attempts_before_their_retries_start(
    quick: Server, start_agent: Callable[..., AgentProc], tmp_path: Path, cut: str
) -> None:
    """Cut off past the lost timeout, the node stops its attempt itself: the agent when it
    cannot reach the server, the attempt's wrapper when its agent is gone. The retry starts
    after that stop, never beside it."""
    ledger = tmp_path / "ledger"
    agents = {name: start_agent(quick, name) for name in ("gpu-a", "gpu-b")}
    wait_online(quick, *agents)
    run_id = submit(quick, tmp_path, TRAIN.format(ledger=ledger, steps=4000), retry=RETRY)
    eventually(lambda: attempts(quick, run_id)[-1]["state"] == "running", 60)
    first = attempts(quick, run_id)[-1]
    on = agents[first["handle"]["target"]]
    frozen = quick.proc if cut == "server frozen" else on.proc
    assert frozen is not None
    frozen.send_signal(signal.SIGSTOP)
    try:
        # the agent (server frozen) or the attempt's wrapper (agent frozen) stops it
        eventually(lambda: first["id"] in _times(ledger, "stop"), 40)
    finally:
        frozen.send_signal(signal.SIGCONT)
    eventually(lambda: len(attempts(quick, run_id)) == 2, 60)
    second = eventually(lambda: _times(ledger, "start").get(attempts(quick, run_id)[-1]["id"]), 60)
    stopped = _times(ledger, "stop")[first["id"]]
    assert stopped < second, (stopped, second)
    lost = attempts(quick, run_id)[0]
    assert lost["reason"] == "node_lost", lost
    orbit(quick.env(), "cancel", run_id)
    ended(quick, run_id)


def test_without_fencing_a_cut_off_node_runs_on(
    start_server: Callable[..., Server], start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    server = start_server(env={**QUICK, "ORBIT_NODE_FENCE": "0"})
    agent = start_agent(server, "gpu-a")
    wait_online(server, "gpu-a")
    run_id = submit(server, tmp_path, "sleep 600", retry={"max_retries": 0})
    eventually(lambda: attempts(server, run_id)[-1]["state"] == "running", 60)
    attempt_id = attempts(server, run_id)[-1]["id"]
    agent.kill(signal.SIGSTOP)
    eventually(lambda: attempts(server, run_id)[-1]["reason"] == "node_lost", 30)
    time.sleep(6)  # past the fence it would have had
    assert _marked_processes(attempt_id)
    agent.kill(signal.SIGCONT)  # back: what the server gave up on is stopped then
    eventually(lambda: not _marked_processes(attempt_id), 30)


UPLOAD_LATER = """\
id: pool-later
placement: {kind: agent_pool, selector: {}, upload_large: false}
launch_mode: {kind: host_process}
defaults: {target: null, detach: true, resources: {cpu_count: 0}}
allow_overrides: [target, num_nodes, resources]
"""


def test_collect_says_within_seconds_what_cannot_come_and_delivers_the_rest(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    (orbit_server.home / "templates").mkdir(exist_ok=True)
    (orbit_server.home / "templates" / "pool-later.yaml").write_text(UPLOAD_LATER)
    agent = start_agent(orbit_server, "gpu-a")
    wait_online(orbit_server, "gpu-a")
    spec = write_spec(
        tmp_path,
        template="pool-later",
        task={
            "command": "echo small > $ORBIT_ARTIFACTS_DIR/small.txt; mkdir -p "
            "$ORBIT_ARTIFACTS_DIR/checkpoints; head -c 70000000 /dev/zero > "
            "$ORBIT_ARTIFACTS_DIR/checkpoints/big.bin"
        },
    )
    run_id = str(orbit_json(orbit_server.env(), "submit", str(spec))["id"])
    attempt = ended(orbit_server, run_id)["attempts"][-1]
    assert attempt["state"] == "succeeded"
    eventually(
        lambda: (
            orbit_server.home / "artifacts" / attempt["id"] / "artifacts" / "small.txt"
        ).exists()
    )
    # the node loses the attempt's folder (a disk replaced, a work dir wiped)
    shutil.rmtree(agent.work_dir / "attempts" / attempt["id"])
    started = time.monotonic()
    said = orbit(
        orbit_server.env(), "collect", run_id, "--dest", str(tmp_path / "out"), check=False
    )
    took = time.monotonic() - started
    assert said.returncode == 1 and took < 20, (took, said.stderr)
    assert "no longer has the attempt's folder" in said.stderr, said.stderr
    assert "checkpoints/big.bin" in said.stderr, said.stderr
    assert (tmp_path / "out" / "small.txt").read_text() == "small\n"
