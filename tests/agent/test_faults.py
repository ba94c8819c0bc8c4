"""Faults with real processes: an agent killed (-9) or frozen (SIGSTOP) past the offline
timeout loses its attempts, which are retried on another node, and what it left running stops
by itself before the retry starts (tests/agent/test_converge.py: fencing); one frozen for less
catches up, its logs arriving once and in order; a run past its max_runtime is stopped with
its own reason."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agent.test_pool_runs import _marked_processes, ended, run_of, submit
from tests.agents import AgentProc, control, wait_online
from tests.helpers import eventually, orbit
from tests.orbit_server import Server

QUICK = {
    "ORBIT_NODE_HEARTBEAT_S": "0.5",
    "ORBIT_NODE_OFFLINE_S": "3",
    "ORBIT_NODE_LOST_GRACE_S": "2",
}
RETRY = {"max_retries": 2, "backoff_s": 0.2}


@pytest.fixture
def quick_server(start_server: Callable[..., Server]) -> Server:
    return start_server(env=QUICK)


@pytest.mark.parametrize("fault", ["kill", "freeze"])
def test_a_node_that_goes_away_loses_its_attempts_to_another_node_and_its_orphans_stop(
    quick_server: Server,
    start_agent: Callable[..., AgentProc],
    tmp_path: Path,
    fault: str,
) -> None:
    first = start_agent(quick_server, "first", labels="pool=a")
    wait_online(quick_server, "first")
    run_id = submit(
        quick_server,
        tmp_path,
        "echo on $ORBIT_NODE_NAME; sleep 300",
        retry=RETRY,
    )
    eventually(lambda: run_of(quick_server, run_id)["attempts"][-1]["state"] == "running", 30)
    lost_attempt = run_of(quick_server, run_id)["attempts"][-1]["id"]
    assert _marked_processes(lost_attempt)
    start_agent(quick_server, "second", labels="pool=a")
    wait_online(quick_server, "second")
    first.kill(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    cut = time.monotonic()

    def moved() -> bool:
        attempts = run_of(quick_server, run_id)["attempts"]
        return len(attempts) == 2 and attempts[-1]["state"] == "running"

    try:
        eventually(moved, timeout=60, every=0.2)
    except AssertionError:
        for a in run_of(quick_server, run_id)["attempts"]:
            print("ATTEMPT", a["id"], a["state"], a["reason"], a["message"], a["handle"])
        print(first.output()[-2000:], quick_server.output()[-4000:])
        raise
    detected = time.monotonic() - cut
    attempts = run_of(quick_server, run_id)["attempts"]
    assert attempts[0]["state"] == "failed" and attempts[0]["reason"] == "node_lost"
    assert attempts[1]["handle"]["target"] == "second"
    print(f"{fault}: lost and running elsewhere after {detected:.1f}s")
    service = control(quick_server)
    try:
        from datetime import UTC, datetime

        assert service.get_node("first").condition(datetime.now(UTC), 3.0) == "offline"
    finally:
        service.close()
    # what the first node ran is stopped there before its retry starts: cut off from the
    # server past the lost timeout, the attempt's wrapper (its agent gone) stops it itself
    assert not _marked_processes(lost_attempt)
    if fault == "kill":
        first.start()
    else:
        first.kill(signal.SIGCONT)
    orbit(quick_server.env(), "cancel", run_id)
    assert ended(quick_server, run_id)["attempts"][-1]["reason"] == "cancelled"


def test_a_node_frozen_for_less_than_the_timeout_catches_up_exactly_once_in_order(
    start_server: Callable[..., Server],
    start_agent: Callable[..., AgentProc],
    tmp_path: Path,
) -> None:
    server = start_server(env={**QUICK, "ORBIT_NODE_OFFLINE_S": "30"})
    agent = start_agent(server, "steady")
    wait_online(server, "steady")
    run_id = submit(server, tmp_path, "for i in $(seq 1 60); do echo line $i; sleep 0.05; done")
    eventually(lambda: run_of(server, run_id)["attempts"][-1]["state"] == "running", 30)
    agent.kill(signal.SIGSTOP)
    time.sleep(2.5)
    agent.kill(signal.SIGCONT)
    run = ended(server, run_id)
    assert run["attempts"][-1]["state"] == "succeeded" and len(run["attempts"]) == 1
    lines = orbit(server.env(), "logs", run_id).stdout.splitlines()
    assert lines == [f"line {i}" for i in range(1, 61)]


def test_a_run_past_its_max_runtime_is_stopped_with_its_own_reason(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    start_agent(orbit_server, "timed")
    wait_online(orbit_server, "timed")
    run_id = submit(
        orbit_server,
        tmp_path,
        "echo start; sleep 300",
        overrides={"max_runtime_s": 2, "stop_grace_s": 1},
    )
    run = ended(orbit_server, run_id, timeout=60)
    last = run["attempts"][-1]
    assert (last["state"], last["reason"]) == ("terminated", "max_runtime")
    assert len(run["attempts"]) == 1  # the task's own doing: not retried
    assert not _marked_processes(last["id"])
