"""GPUs on pool nodes, end to end: a real `orbit server`, and a real `orbit agent` whose NVML is
the replay of a recording of a real two-H100 machine (tests/data/nvml/h100-recording.json;
there is no GPU here). The node reports the GPUs, runs get distinct GPUs while they run side by
side, a run asking more than the node has waits and says why, and memory reservations share a
GPU that a whole-GPU run never shares."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.agent.test_pool_runs import ended, run_of
from tests.agents import NVML_DATA, AgentProc, control, nvml_env, wait_online, with_xids
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server

H100 = NVML_DATA / "h100-recording.json"
NO_DRIVER = NVML_DATA / "no-driver-recording.json"
HOLD = 'echo "gpus=[$CUDA_VISIBLE_DEVICES]"; while [ ! -e {flag} ]; do sleep 0.1; done; echo done'


def submit(server: Server, folder: Path, command: str, *flags: str, **resources: Any) -> str:
    spec = write_spec(
        folder,
        name=f"spec-{time.monotonic_ns()}.yaml",
        template="pool",
        task={"command": command},
        overrides={"resources": resources},
    )
    return str(orbit_json(server.env(), "submit", str(spec), *flags)["id"])


def state(server: Server, run_id: str) -> str:
    return str(run_of(server, run_id)["attempts"][-1]["state"])


def running(server: Server, *run_ids: str) -> bool:
    return all(state(server, r) == "running" for r in run_ids)


def wait_running(server: Server, agent: AgentProc, *run_ids: str, timeout: float = 120) -> None:
    """Until every one of the runs runs; failing, says where each one is."""
    try:
        eventually(lambda: running(server, *run_ids), timeout=timeout, every=0.2)
    except AssertionError:
        where = [(a["state"], a["message"]) for r in run_ids for a in run_of(server, r)["attempts"]]
        raise AssertionError(f"not all running: {where}\n{agent.output()[-3000:]}") from None


def gpus_of(server: Server, run_id: str) -> str:
    """The CUDA_VISIBLE_DEVICES the task saw, from its own log."""

    def seen() -> str | None:
        found = re.search(r"gpus=\[([0-9,]*)\]", orbit(server.env(), "logs", run_id).stdout)
        return found.group(1) if found else None

    return eventually(seen, timeout=30, every=0.2)


def waiting_message(server: Server, run_id: str) -> str:
    attempt = run_of(server, run_id)["attempts"][-1]
    assert attempt["state"] == "prepared", attempt
    return str(attempt["message"] or "")


def test_the_node_reports_the_recorded_gpus(
    orbit_server: Server, start_agent: Callable[..., AgentProc]
) -> None:
    start_agent(orbit_server, "h100x2", env=nvml_env(H100))
    start_agent(orbit_server, "cpu-only", env=nvml_env(NO_DRIVER))
    wait_online(orbit_server, "h100x2", "cpu-only")
    service = control(orbit_server)
    try:
        info = service.get_node("h100x2").info
        bare = service.get_node("cpu-only").info
    finally:
        service.close()
    assert info["accelerator_source"] == "nvml"
    assert [(g["index"], g["model"], g["memory_mb"]) for g in info["accelerators"]] == [
        (0, "NVIDIA H100 80GB HBM3", 81559),
        (1, "NVIDIA H100 80GB HBM3", 81559),
    ]
    assert info["cpus"] > 0 and info["memory_mb"] > 0 and info["disk_free_mb"] > 0
    assert bare["accelerators"] == []
    assert bare["accelerator_source"] == "nvml: NVML_ERROR_LIBRARY_NOT_FOUND (12)"


def test_gpu_runs_get_their_own_gpus_side_by_side_and_too_big_a_run_waits(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    agent = start_agent(orbit_server, "h100x2", max_tasks=4, env=nvml_env(H100))
    wait_online(orbit_server, "h100x2")
    flag = tmp_path / "go"
    first = submit(orbit_server, tmp_path, HOLD.format(flag=flag), gpu_count=1)
    second = submit(orbit_server, tmp_path, HOLD.format(flag=flag), gpu_count=1)
    wait_running(orbit_server, agent, first, second)
    assert {gpus_of(orbit_server, first), gpus_of(orbit_server, second)} == {"0", "1"}
    # both GPUs are taken: a third one-GPU run waits for one, and says so
    third = submit(orbit_server, tmp_path, HOLD.format(flag=flag), gpu_count=1)
    # more GPUs than any node has: refused at submit with the largest node's figures, or
    # queued anyway, waiting and saying why
    spec = write_spec(
        tmp_path,
        name="huge.yaml",
        template="pool",
        task={"command": "echo never"},
        overrides={"resources": {"gpu_count": 3}},
    )
    refused = orbit(orbit_server.env(), "submit", str(spec), check=False)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "resources: no registered node could ever hold gpu 3" in refused.stderr
    assert "the largest, h100x2, has 2 GPU(s) (H100-80GB)" in refused.stderr
    huge = submit(orbit_server, tmp_path, "echo never", "--queue-anyway", gpu_count=3)
    time.sleep(2)
    assert waiting_message(orbit_server, third) == (
        "0/1 nodes fit: 1 gpus busy (2/2 in use, need 1)"
    )
    assert waiting_message(orbit_server, huge) == "0/1 nodes fit: 1 too few gpus (need 3, have 2)"
    assert running(orbit_server, first, second)  # still side by side
    flag.touch()
    for run_id in (first, second, third):
        assert ended(orbit_server, run_id)["attempts"][-1]["state"] == "succeeded", agent.output()
    assert gpus_of(orbit_server, third) in ("0", "1")
    assert state(orbit_server, huge) == "prepared"
    orbit(orbit_server.env(), "cancel", huge)


def test_memory_reservations_share_a_gpu_that_a_whole_gpu_run_does_not(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    agent = start_agent(orbit_server, "h100x2", max_tasks=4, env=nvml_env(H100))
    wait_online(orbit_server, "h100x2")
    flag = tmp_path / "go"
    hold = HOLD.format(flag=flag)
    # 2 x 30 GB fit on one 79.6 GB H100
    small = [submit(orbit_server, tmp_path, hold, gpu_count=1, gpu_memory_gb=30) for _ in "ab"]
    wait_running(orbit_server, agent, *small)
    assert [gpus_of(orbit_server, r) for r in small] == ["0", "0"]
    # a whole-GPU run does not share GPU 0: it gets GPU 1
    whole = submit(orbit_server, tmp_path, hold, gpu_count=1)
    wait_running(orbit_server, agent, whole)
    assert gpus_of(orbit_server, whole) == "1"
    # and with GPU 1 whole and 60 GB reserved on GPU 0, neither kind of run fits any more
    another_whole = submit(orbit_server, tmp_path, "echo whole", gpu_count=1)
    too_much = submit(orbit_server, tmp_path, "echo 30 more", gpu_count=1, gpu_memory_gb=30)
    time.sleep(2)
    for run_id in (another_whole, too_much):
        assert waiting_message(orbit_server, run_id).startswith("0/1 nodes fit: 1 gpus busy")
    assert running(orbit_server, *small, whole)
    flag.touch()
    for run_id in (*small, whole, another_whole, too_much):
        assert ended(orbit_server, run_id)["attempts"][-1]["state"] == "succeeded", agent.output()


@pytest.fixture(autouse=True)
def _quick_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORBIT_NODE_HEARTBEAT_S", "1")


def test_a_gpu_with_an_xid_gets_no_work_and_explain_says_so(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    # GPU 1 reports xid 79 (fallen off the bus) a second after the agent starts; GPU 0 an xid
    # the application caused (13), which says nothing about the GPU
    recording = with_xids(H100, tmp_path / "xids.json", [None, (0, 13), None, (1, 79)])
    agent = start_agent(orbit_server, "h100x2", max_tasks=4, env=nvml_env(recording))
    wait_online(orbit_server, "h100x2")

    def health() -> list[tuple[bool, str]]:
        service = control(orbit_server)
        try:
            gpus = service.get_node("h100x2").info["accelerators"]
        finally:
            service.close()
        return [(g.get("healthy", True), g.get("problem", "")) for g in gpus]

    eventually(lambda: health() == [(True, ""), (False, "xid 79")], timeout=30, every=0.2)
    both = submit(orbit_server, tmp_path, "echo never", gpu_count=2)  # queued: it may recover
    one = submit(orbit_server, tmp_path, 'echo "gpus=[$CUDA_VISIBLE_DEVICES]"', gpu_count=1)
    assert ended(orbit_server, one)["attempts"][-1]["state"] == "succeeded", agent.output()
    assert gpus_of(orbit_server, one) == "0"
    assert waiting_message(orbit_server, both) == "0/1 nodes fit: 1 unhealthy gpu (gpu 1: xid 79)"
    explained = orbit(orbit_server.env(), "explain", both).stdout
    assert "gpu 1: xid 79" in explained
    orbit(orbit_server.env(), "cancel", both)
