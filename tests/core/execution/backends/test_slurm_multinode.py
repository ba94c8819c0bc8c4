"""A run of num_nodes 2 on the private Slurm's partition `multi` (tests/slurm.py: node1 and node2,
two slurmd on this machine): one Slurm job of two nodes, srun starting the bundle's wrapper once
per node, each rank told its place by Slurm's environment and writing its own files."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from tests.core.execution.backends.test_slurm_host_process import add_cluster, job_id, spec
from tests.helpers import eventually, orbit, orbit_json
from tests.slurm import NODES, SlurmCluster

WHO = (
    'echo "rank=$ORBIT_NODE_RANK of=$ORBIT_NUM_NODES node=$SLURMD_NODENAME '
    'master=$ORBIT_MASTER_ADDR:$ORBIT_MASTER_PORT gpus=$CUDA_VISIBLE_DEVICES" '
    '> "$ORBIT_ARTIFACTS_DIR/who.txt"'
)


@pytest.fixture
def env(orbit_home: Path, tmp_path: Path, slurm: SlurmCluster) -> dict[str, str]:
    env = {
        **os.environ,
        "ORBIT_HOME": str(orbit_home),
        "ORBIT_DATABASE_URL": f"sqlite:///{tmp_path / 'orbit.db'}",
        "COLUMNS": "200",
    }
    add_cluster(env, slurm, tmp_path, "multi", "--partition", "multi")
    return env


def who(folder: Path) -> dict[str, str]:
    text = (folder / "who.txt").read_text()
    return dict(word.split("=", 1) for word in text.split())


def submit(env: dict[str, str], tmp_path: Path, command: str, **overrides: Any) -> dict[str, Any]:
    path = spec(tmp_path, command, "multi", num_nodes=2, **overrides)
    return dict(orbit_json(env, "submit", str(path)))


def attempt_processes(attempt_id: str) -> list[int]:
    found = []
    for p in psutil.process_iter(["environ"]):
        if (p.info["environ"] or {}).get("ORBIT_ATTEMPT_ID") == attempt_id:
            found.append(p.pid)
    return found


def test_two_nodes_are_one_job_with_a_wrapper_on_each_node_and_their_files_collected(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path
) -> None:
    run = submit(env, tmp_path, WHO, resources={"gpu_count": 1})
    orbit(env, "logs", run["id"], "--follow", timeout=120)
    shown = orbit_json(env, "status", run["id"])
    assert shown["state"] == "succeeded", shown
    job = slurm.run("scontrol", "-o", "show", "job", job_id(run)).stdout
    assert "NumNodes=2" in job and "NodeList=node[1-2]" in job
    location = Path(run["attempts"][0]["handle"]["location"])
    script = (location / "scripts" / "slurm.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gres=gpu:1" in script
    assert "srun --nodes=2 --ntasks=2 --ntasks-per-node=1" in script
    # each rank was told its place by Slurm, met at rank 0's NodeAddr, had its own GPU
    first, second = who(location / "artifacts"), who(location / "nodes" / "1" / "artifacts")
    assert (first["rank"], first["node"]) == ("0", NODES[0])
    assert (second["rank"], second["node"]) == ("1", NODES[1])
    assert first["of"] == second["of"] == "2"
    assert first["master"] == second["master"] and first["master"].startswith("127.0.0.1:")
    assert first["gpus"] and second["gpus"]
    for folder in (location, location / "nodes" / "1"):  # each node's own wrapper and files
        assert "wrapper started" in (folder / "runtime" / "runtime.log").read_text()
        assert json.loads((folder / "runtime" / "result.json").read_text())["state"] == "succeeded"
        assert (folder / "artifacts" / "manifest.json").exists()
    dest = tmp_path / "collected"
    collected = orbit_json(env, "collect", run["id"], "--dest", str(dest))
    assert collected["verified"] is True, collected
    assert who(dest)["rank"] == "0" and who(dest / "nodes" / "1")["rank"] == "1"
    assert (dest / "nodes" / "1" / "manifest.json").exists()
    # a rank's folder gone from the cluster: the rest is collected, the gap said
    shutil.rmtree(location / "nodes" / "1")
    proc = orbit(
        env, "collect", run["id"], "--dest", str(tmp_path / "again"), "--json", check=False
    )
    assert proc.returncode == 1, proc.stderr  # not verified: said by the exit status too
    again = json.loads(proc.stdout)
    assert again["verified"] is False and who(tmp_path / "again")["rank"] == "0"
    assert [p for p in again["problems"] if p.startswith("rank 1: never started")], again


def test_every_rank_reads_its_own_copy_of_the_secrets_and_none_is_left_on_disk(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path
) -> None:
    value = "hf_EveryRank_0a9b8c7d6e5f"
    subprocess.run(
        [sys.executable, "-m", "orbit", "secrets", "set", "hf"], env=env, input=value,
        text=True, check=True, capture_output=True,
    )  # fmt: skip
    command = 'echo "rank $ORBIT_NODE_RANK token=$HF_TOKEN"; printf %s "$HF_TOKEN" | sha256sum'
    path = spec(tmp_path, command, "multi", num_nodes=2)
    path.write_text(path.read_text() + "secrets: {HF_TOKEN: hf}\n")
    run = dict(orbit_json(env, "submit", str(path)))
    orbit(env, "logs", run["id"], "--follow", timeout=120)
    assert orbit_json(env, "status", run["id"])["state"] == "succeeded"
    location = Path(run["attempts"][0]["handle"]["location"])
    digest = hashlib.sha256(value.encode()).hexdigest()
    for rank, folder in ((0, location), (1, location / "nodes" / "1")):
        log = (folder / "artifacts" / "training.log").read_text()
        assert f"rank {rank} token=***" in log and digest in log, log
    assert not (location / "secrets").exists()  # each rank's file read and deleted
    for found in tmp_path.rglob("*"):
        if found.is_file() and not found.is_symlink():
            assert value.encode() not in found.read_bytes(), found


def test_a_failing_rank_fails_the_run_naming_it_and_ends_the_whole_job(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path
) -> None:
    # rank 1 fails at once; rank 0 would wait forever on it (as a collective would)
    command = 'if [ "$ORBIT_NODE_RANK" = 1 ]; then echo boom; exit 3; fi; sleep 600'
    run = submit(env, tmp_path, command)
    ended = orbit(env, "logs", run["id"], "--follow", timeout=120, check=False)
    assert ended.returncode != 0 and "exit 3" in ended.stderr
    attempt = orbit_json(env, "runs", "show", run["id"])["attempts"][0]
    assert attempt["state"] == "failed" and attempt["reason"] == "task_exit_nonzero"
    assert attempt["exit_code"] == 3 and attempt["message"].startswith("rank 1 (")
    slurm.wait("the job to leave the queue", lambda: not slurm.queue())
    eventually(lambda: not attempt_processes(attempt["id"]), timeout=30)  # rank 0's sleep too


def test_cancel_gives_every_rank_its_grace_and_nothing_stays_in_the_queue(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path
) -> None:
    # rank 0 takes 3 s to stop (a checkpoint), rank 1 none: rank 1's end must not cut rank 0's
    command = (
        'trap \'if [ "$ORBIT_NODE_RANK" = 0 ]; then sleep 3; echo saved; fi; '
        "echo got TERM; exit 3' TERM; echo started; while :; do sleep 0.1; done"
    )
    run = submit(env, tmp_path, command, stop_grace_s=30)
    location = Path(run["attempts"][0]["handle"]["location"])
    logs = [location / "artifacts" / "training.log", location / "nodes/1/artifacts/training.log"]
    eventually(
        lambda: all(p.exists() and "started" in p.read_text(errors="replace") for p in logs),
        timeout=60,
    )
    orbit(env, "cancel", run["id"])

    def ended() -> dict[str, Any] | None:
        attempt: dict[str, Any] = orbit_json(env, "runs", "show", run["id"])["attempts"][0]
        return attempt if attempt["state"] in ("terminated", "failed", "succeeded") else None

    attempt = eventually(ended, timeout=60, every=0.2)
    assert (attempt["state"], attempt["reason"]) == ("terminated", "cancelled"), attempt
    slurm.wait("the cancelled job to leave the queue", lambda: not slurm.queue())
    assert "saved" in logs[0].read_text()  # rank 0 had its grace
    for rank, log in enumerate(logs):  # each rank's task had its TERM, and says why it ended
        assert "got TERM" in log.read_text(), rank
        result = json.loads((log.parent.parent / "runtime" / "result.json").read_text())
        assert (result["state"], result["reason"]) == ("terminated", "cancelled"), rank
    assert (location / "artifacts" / "manifest.json").exists()


def test_a_rank_whose_wrapper_dies_fails_the_run_at_once_as_runtime_lost(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path
) -> None:
    # rank 1's wrapper is killed outright (its task's parent); rank 0 would run on and on
    command = 'if [ "$ORBIT_NODE_RANK" = 1 ]; then kill -9 "$PPID"; fi; sleep 600'
    path = spec(tmp_path, command, "multi", {"max_retries": 0}, num_nodes=2)
    run = orbit_json(env, "submit", str(path))
    ended = orbit(env, "logs", run["id"], "--follow", timeout=120, check=False)
    assert ended.returncode != 0
    attempt = orbit_json(env, "runs", "show", run["id"])["attempts"][0]
    assert (attempt["state"], attempt["reason"]) == ("failed", "runtime_lost"), attempt
    assert attempt["message"].startswith("rank 1 (")
    assert f"the wrapper of rank 1 on {NODES[1]} ended (exit 137)" in attempt["message"]
    slurm.wait("the job to leave the queue", lambda: not slurm.queue())
    eventually(lambda: not attempt_processes(attempt["id"]), timeout=30)


def test_more_nodes_than_the_partition_has_are_refused_before_anything_is_staged(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path
) -> None:
    proc = orbit(env, "submit", str(spec(tmp_path, "true", "multi", num_nodes=3)), check=False)
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1
    assert "partition multi has 2 node(s)" in proc.stderr and "num_nodes 3" in proc.stderr
    assert orbit_json(env, "runs", "list") == [] and slurm.queue() == []
