"""What a pool node gives a run besides GPUs, end to end with real `orbit server` and `orbit
agent` processes: a container on the node's Docker (pool-docker, against the private dockerd of
tests/dockerd.py), and the CPUs a host process is pinned to."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.agent.test_pool_runs import ended, run_of
from tests.agents import AgentProc, control, wait_online
from tests.dockerd import Dockerd
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server

AFFINITY = "python3 -c 'import os; print(\"cpus\", sorted(os.sched_getaffinity(0)))'"


def submit(server: Server, folder: Path, template: str, command: Any, **overrides: Any) -> str:
    spec = write_spec(
        folder,
        name=f"spec-{time.monotonic_ns()}.yaml",
        template=template,
        task={"command": command},
        overrides=overrides,
    )
    return str(orbit_json(server.env(), "submit", str(spec))["id"])


def succeeded(server: Server, run_id: str, agent: AgentProc) -> str:
    """The run's log, once it succeeded."""
    attempt = ended(server, run_id, timeout=120)["attempts"][-1]
    assert attempt["state"] == "succeeded", (attempt, agent.output()[-3000:])
    return orbit(server.env(), "logs", run_id).stdout


def cpus_seen(log: str) -> list[int]:
    found = re.search(r"cpus \[([0-9, ]*)\]", log)
    assert found, log
    return [int(c) for c in found.group(1).split(",") if c.strip()]


def test_a_pool_docker_run_runs_in_a_container_on_the_nodes_docker(
    orbit_server: Server,
    start_agent: Callable[..., AgentProc],
    dockerd: Dockerd,
    tmp_path: Path,
) -> None:
    agent = start_agent(orbit_server, "dock", env={"DOCKER_HOST": dockerd.host})
    wait_online(orbit_server, "dock")
    service = control(orbit_server)
    try:
        info = service.get_node("dock").info
    finally:
        service.close()
    assert (info["docker"], info["nvidia_runtime"]) == (True, False)
    command = ["sh", "-c", "echo in $(cat /etc/orbit-test-image) as $ORBIT_ATTEMPT_ID; echo end"]
    run_id = submit(orbit_server, tmp_path, "pool-docker", command, image=dockerd.image)
    log = succeeded(orbit_server, run_id, agent)
    attempt = run_of(orbit_server, run_id)["attempts"][-1]
    assert attempt["handle"]["target"] == "dock"
    # the marker file exists only in the test image: the task ran in its container
    assert f"in {dockerd.image} as {attempt['id']}" in log and log.rstrip().endswith("end")
    runtime = orbit(orbit_server.env(), "logs", run_id, "--layer", "runtime").stdout
    # the node's Docker ran that exact image, and removed its container when it ended
    assert f"image {dockerd.image} is {dockerd.image_id(dockerd.image)}" in runtime
    assert "removed 1 container(s) of this attempt" in runtime
    assert dockerd.containers(f"label=orbit.attempt={attempt['id']}") == []


def test_a_pool_host_process_sees_only_the_cpus_it_asked_for(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    # the agent has CPUs 0 and 1 (a 2-CPU machine, whatever this one has)
    agent = start_agent(orbit_server, "two-cpus", max_tasks=4, prefix=["taskset", "-c", "0,1"])
    wait_online(orbit_server, "two-cpus")
    one = submit(orbit_server, tmp_path, "pool", AFFINITY, resources={"cpu_count": 1})
    assert len(cpus_seen(succeeded(orbit_server, one, agent))) == 1
    # asking for all of them, or for none, pins nothing
    for count in (2, 0):
        run_id = submit(orbit_server, tmp_path, "pool", AFFINITY, resources={"cpu_count": count})
        assert cpus_seen(succeeded(orbit_server, run_id, agent)) == [0, 1]
    # two one-CPU runs side by side get one CPU each, not the same one
    flag = tmp_path / "go"
    hold = f"{AFFINITY}; while [ ! -e {flag} ]; do sleep 0.1; done"
    pair = [submit(orbit_server, tmp_path, "pool", hold, resources={"cpu_count": 1}) for _ in "ab"]
    eventually(
        lambda: all(run_of(orbit_server, r)["attempts"][-1]["state"] == "running" for r in pair),
        timeout=120,
        every=0.2,
    )
    flag.touch()
    seen = [cpus_seen(succeeded(orbit_server, r, agent)) for r in pair]
    assert sorted(seen) == [[0], [1]]


@pytest.fixture(autouse=True)
def _quick_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORBIT_NODE_HEARTBEAT_S", "1")
