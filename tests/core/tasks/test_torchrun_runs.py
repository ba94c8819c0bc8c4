"""Real `torchrun` jobs with torch on CPU (gloo): two-process DDP through ORBIT, locally and on an
agent node; a failing rank; a cancel; two nodes meeting at a rendezvous, and one that never
comes. Skipped without torch (pip install torch==2.13.0), failed with ORBIT_REQUIRE_TORCH=1."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orbit.core.tasks.torchrun import LAUNCHER
from tests.agents import AgentProc, wait_online
from tests.helpers import eventually, orbit, orbit_json, process_alive, sqlite_env, write_spec
from tests.orbit_server import Server
from tests.slurm import SlurmCluster

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "torchrun-ddp"


@pytest.fixture(autouse=True)
def _torch() -> None:
    if importlib.util.find_spec("torch") is None:
        if os.environ.get("ORBIT_REQUIRE_TORCH") == "1":
            pytest.fail("torch is required (ORBIT_REQUIRE_TORCH=1) but is not installed")
        pytest.skip("torch is not installed (pip install torch==2.13.0)")


def ddp_task(**more: Any) -> dict[str, Any]:
    """The example, run by this interpreter: a local task's python3 is not ORBIT's venv's."""
    return {
        "script": str(EXAMPLE / "train.py"),
        "args": ["--steps", "30"],
        "nproc_per_node": 2,
        "interpreter": sys.executable,
        **more,
    }


def ran_through(code: int, output: str, why: str) -> None:
    """The run succeeded. Or torch 2.13's gloo aborted a rank as it tore down after its last
    step (`terminate called without an active exception`: about 2 in 100 two-rank runs of the
    example on this 2-core machine under load, a barrier before destroy_process_group or not).
    That abort is torch's; ORBIT's part is to say which rank ended how, checked here before
    the test is marked xfail with torch's words."""
    if code == 0:
        return
    aborted = re.findall(r"\[rank(\d+)\]: terminate called without an active exception", output)
    finished = set(re.findall(r"\[rank(\d+)\]: step (\d+)/\2\b", output))
    if aborted and all(any(r == rank for r, _ in finished) for rank in aborted):
        assert re.search(r"orbit: rank \d+ failed first: killed by SIGABRT", output), why
        pytest.xfail(f"torch's gloo aborted rank(s) {', '.join(aborted)} after the last step")
    raise AssertionError(why)


def collected(env: dict[str, str], run_id: str, dest: Path) -> Path:
    orbit(env, "collect", run_id, "--dest", str(dest))
    return next(dest.rglob("ranks")).parent


def test_two_process_ddp_runs_locally_each_rank_kept_apart(tmp_path: Path) -> None:
    env = sqlite_env(tmp_path / "home", tmp_path / "orbit.db")
    spec = write_spec(tmp_path, task_type="torchrun", task=ddp_task())
    run_id = orbit_json(env, "submit", str(spec))["id"]
    followed = orbit(env, "logs", run_id, "--follow", check=False, timeout=300)
    ran_through(followed.returncode, followed.stdout, followed.stdout[-3000:])
    assert "[rank1]: rank 1 of 2 on cpu (gloo)" in followed.stdout
    assert "[rank0]: done: loss" in followed.stdout
    status = orbit_json(env, "status", run_id)
    assert status["state"] == "succeeded"
    assert (status["progress"]["step"], status["progress"]["max_steps"]) == (30, 30)
    artifacts = collected(env, run_id, tmp_path / "out")
    rank0 = (artifacts / "ranks" / "0.log").read_text()
    rank1 = (artifacts / "ranks" / "1.log").read_text()
    assert "rank 0 of 2" in rank0 and "rank 1 of 2" not in rank0
    assert "rank 1 of 2" in rank1 and "done: loss" not in rank1
    assert (artifacts / "checkpoints" / "step-30.pt").is_file()


def submit(env: dict[str, str], tmp_path: Path, script: str) -> str:
    """A two-rank job of `script`, staged from a folder of its own (not the ORBIT home's)."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.py").write_text(script)
    task = {"script": "job.py", "nproc_per_node": 2, "interpreter": sys.executable}
    return str(
        orbit_json(env, "submit", str(write_spec(job, task_type="torchrun", task=task)))["id"]
    )


FAILS = """
import os, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank} up", flush=True)
if rank == 1:
    print("rank 1: out of data", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(300)
"""


def test_a_failing_rank_is_the_tasks_exit_with_its_own_code(tmp_path: Path) -> None:
    env = sqlite_env(tmp_path / "home", tmp_path / "orbit.db")
    run_id = submit(env, tmp_path, FAILS)
    followed = orbit(env, "logs", run_id, "--follow", check=False, timeout=300)
    assert followed.returncode != 0
    assert "orbit: rank 1 failed first: exit code 3 (its output: ranks/1.log)" in followed.stdout
    attempt = orbit_json(env, "status", run_id)["attempts"][-1]
    assert attempt["state"] == "failed"
    assert (attempt["reason"], attempt["exit_code"]) == ("task_exit_nonzero", 3), attempt
    artifacts = collected(env, run_id, tmp_path / "out")
    assert "rank 1: out of data" in (artifacts / "ranks" / "1.log").read_text()
    assert "out of data" not in (artifacts / "ranks" / "0.log").read_text()


HANGS = """
import os, time
from pathlib import Path
Path(os.environ["ORBIT_ARTIFACTS_DIR"], f"pid-{os.environ['RANK']}").write_text(str(os.getpid()))
while True:
    time.sleep(1)
"""


def marked(attempt_id: str) -> set[int]:
    """The live processes carrying the attempt's marker: wrapper, launcher, torchrun, ranks."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"ORBIT_ATTEMPT_ID={attempt_id}".encode() in environ and process_alive(int(entry.name)):
            found.add(int(entry.name))
    return found


def test_a_cancel_stops_torchrun_and_every_worker(tmp_path: Path) -> None:
    env = sqlite_env(tmp_path / "home", tmp_path / "orbit.db")
    run_id = submit(env, tmp_path, HANGS)
    work = tmp_path / "home" / "work"

    def ranks() -> list[int]:
        found = [p.read_text() for p in work.glob("*/artifacts/pid-*")] if work.is_dir() else []
        return [int(pid) for pid in found if pid]

    workers = eventually(lambda: len(ranks()) == 2 and ranks(), 120)
    assert len(workers) == 2 and all(process_alive(pid) for pid in workers)
    attempt_id = orbit_json(env, "status", run_id)["attempts"][-1]["id"]
    before = marked(attempt_id)
    assert set(workers) < before and len(before) >= 6  # + wrapper, launcher, torchrun, 2 ranks'
    orbit(env, "cancel", run_id)
    eventually(lambda: not any(process_alive(pid) for pid in before), 60)
    attempt = eventually(
        lambda: (
            (a := orbit_json(env, "status", run_id)["attempts"][-1])["state"] != "running" and a
        ),
        60,
    )
    assert attempt["state"] == "terminated"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node(tmp_path: Path, rank: int, nodes: int, port: int, **task: Any) -> subprocess.Popen[str]:
    """The launcher as the wrapper starts it on node `rank` of a gang (the env the gang's
    placement sets), the example in its workdir."""
    here = tmp_path / f"node{rank}"
    (here / "bundle").mkdir(parents=True)
    (here / "bundle" / "job.json").write_text(json.dumps({"resources": {"gpu_count": 0}}))
    shutil.copy(EXAMPLE / "train.py", here / "train.py")
    settings = {
        "target": "train.py",
        "module": False,
        "args": ["--steps", "20"],
        "nproc_per_node": 1,
        "max_restarts": 0,
        "rdzv": {"backend": "static", "conf": {}},
        "join_timeout_s": 300,
        **task,
    }
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CUDA_"))}
    env = {
        **base,
        "ORBIT_TORCHRUN": json.dumps(settings),
        "ORBIT_ARTIFACTS_DIR": str(here / "artifacts"),
        "ORBIT_BUNDLE_DIR": str(here / "bundle"),
        "ORBIT_NUM_NODES": str(nodes),
        "ORBIT_NODE_RANK": str(rank),
        "ORBIT_MASTER_ADDR": "127.0.0.1",
        "ORBIT_MASTER_PORT": str(port),
    }
    return subprocess.Popen(
        [sys.executable, str(LAUNCHER)],
        cwd=here,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_two_nodes_meet_at_the_gangs_rendezvous_with_their_own_ranks(tmp_path: Path) -> None:
    port = free_port()
    nodes = [node(tmp_path, rank, 2, port) for rank in (0, 1)]
    outputs = [n.communicate(timeout=300)[0] for n in nodes]
    ran_through(max(abs(n.returncode) for n in nodes), "\n".join(outputs), repr(outputs))
    assert "--nnodes=2 --rdzv-backend=static" in outputs[1] and "--node-rank=1" in outputs[1]
    assert "rank 1 of 2 on cpu (gloo)" in (tmp_path / "node1/artifacts/ranks/1.log").read_text()
    assert "rank 0 of 2" in (tmp_path / "node0/artifacts/ranks/0.log").read_text()
    assert not (tmp_path / "node0/artifacts/ranks/1.log").exists()


def test_a_node_that_never_joins_fails_the_rendezvous_in_the_time_the_request_sets(
    tmp_path: Path,
) -> None:
    """torchrun's own default is 600 s; communicate's timeout (120 s) would fail this first."""
    alone = node(tmp_path, 0, 2, free_port(), join_timeout_s=3)
    output = alone.communicate(timeout=120)[0]
    assert alone.returncode != 0
    assert "waiting for clients. 1/2 clients joined" in output
    assert "did every one of the 2 nodes join the rendezvous" in output
    assert "within 3 s (task.join_timeout_s)" in output


def test_two_process_ddp_runs_on_an_agent_node(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    agent = start_agent(orbit_server, "trainer", max_tasks=1)
    wait_online(orbit_server, "trainer")
    env = orbit_server.env()
    spec = write_spec(tmp_path, task_type="torchrun", template="pool", task=ddp_task())
    run_id = orbit_json(env, "submit", str(spec))["id"]
    followed = orbit(env, "logs", run_id, "--follow", check=False, timeout=300)
    why = f"{followed.stdout[-3000:]}\n{agent.output()[-2000:]}"
    ran_through(followed.returncode, followed.stdout, why)
    assert "[rank1]: rank 1 of 2 on cpu (gloo)" in followed.stdout
    status = orbit_json(env, "status", run_id)
    assert status["attempts"][-1]["handle"]["target"] == "trainer"
    artifacts = collected(env, run_id, tmp_path / "out")
    assert "rank 1 of 2" in (artifacts / "ranks" / "1.log").read_text()
    assert "rank 0 of 2" in (artifacts / "ranks" / "0.log").read_text()


def test_ddp_across_two_agent_nodes_of_a_gang(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    """num_nodes 2 on a pool: one worker on each of two real agents, meeting at the gang's
    rendezvous (rank 0's --address and the gang's port) for one DDP job of world size 2."""
    agents = [
        start_agent(orbit_server, name, max_tasks=1, extra=["--address", "127.0.0.1"])
        for name in ("left", "right")
    ]
    wait_online(orbit_server, "left", "right")
    env = orbit_server.env()
    spec = write_spec(
        tmp_path,
        task_type="torchrun",
        template="pool",
        task=ddp_task(nproc_per_node=1, join_timeout_s=60),
        overrides={"num_nodes": 2},
    )
    run_id = orbit_json(env, "submit", str(spec))["id"]
    followed = orbit(env, "logs", run_id, "--follow", check=False, timeout=300)
    logs = [a.output()[-2000:] for a in agents]
    ran_through(followed.returncode, followed.stdout, f"{followed.stdout[-3000:]}\n{logs}")
    assert "rank 0 of 2 on cpu (gloo)" in followed.stdout  # rank 0's node: the run's log
    assert "[rank0]: done: loss" in followed.stdout
    status = orbit_json(env, "status", run_id)
    assert status["state"] == "succeeded"
    dest = tmp_path / "out"
    orbit(env, "collect", run_id, "--dest", str(dest))
    # the other node's worker, brought back under nodes/1/: rank 1 of the same world
    other = "".join(p.read_text() for p in (dest / "nodes" / "1").rglob("ranks/*.log"))
    assert "rank 1 of 2 on cpu (gloo)" in other, other[-2000:]


def test_ddp_across_two_nodes_of_one_slurm_job(slurm: SlurmCluster, tmp_path: Path) -> None:
    """num_nodes 2 on Slurm: one job of two nodes (tests/slurm.py's partition `multi`), srun
    starting the wrapper on each; torchrun meets at the address and port the batch shell took
    from Slurm (rank 0's NodeAddr), for one DDP job of world size 2."""
    env = sqlite_env(tmp_path / "home", tmp_path / "orbit.db")
    orbit(env, "clusters", "add", "multi", "--local", "--partition", "multi",
          "--slurm-conf", str(slurm.conf), "--work-dir", str(tmp_path / "cluster"))  # fmt: skip
    spec = write_spec(
        tmp_path,
        task_type="torchrun",
        template="slurm",
        task=ddp_task(nproc_per_node=1, join_timeout_s=60),
        overrides={"target": "multi", "num_nodes": 2, "resources": {"cpu_count": 2}},
    )
    run_id = orbit_json(env, "submit", str(spec))["id"]
    followed = orbit(env, "logs", run_id, "--follow", check=False, timeout=300)
    ran_through(followed.returncode, followed.stdout, followed.stdout[-3000:])
    assert "rank 0 of 2 on cpu (gloo)" in followed.stdout
    assert orbit_json(env, "status", run_id)["state"] == "succeeded"
    dest = tmp_path / "out"
    orbit(env, "collect", run_id, "--dest", str(dest))
    other = "".join(p.read_text() for p in (dest / "nodes" / "1").rglob("ranks/*.log"))
    assert "rank 1 of 2 on cpu (gloo)" in other, other[-2000:]
    assert (dest / "checkpoints" / "step-30.pt").is_file()  # rank 0's, as on one node
