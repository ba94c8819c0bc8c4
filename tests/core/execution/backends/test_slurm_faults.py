"""Faults of the real private Slurm (tests/slurm.py) while ORBIT's jobs are in it: slurmctld
restarted, the node set DOWN by an admin, the time limit reached with nobody looking."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from tests.core.execution.backends.test_slurm_host_process import add_cluster, env, job_id
from tests.helpers import orbit, orbit_json, write_spec
from tests.slurm import GPU_TYPE, SlurmCluster

__all__ = ["env"]  # the fixture, shared


def submit(env: dict[str, str], tmp_path: Path, name: str, command: str, **fields: Any) -> Any:
    folder = tmp_path / name
    folder.mkdir()
    overrides = {"target": "here", **fields.pop("overrides", {})}
    path = write_spec(
        folder, template="slurm", task={"command": command}, overrides=overrides, **fields
    )
    return orbit_json(env, "submit", str(path))


def test_a_slurmctld_restart_while_jobs_run_and_wait_loses_nothing(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path
) -> None:
    add_cluster(env, slurm, tmp_path)
    go = tmp_path / "go"
    both = {"gpu_count": 2, "gpu_type": GPU_TYPE}
    running = submit(
        env,
        tmp_path,
        "running",
        f"echo started; while [ ! -e {go} ]; do sleep 0.2; done; echo finished",
        overrides={"resources": both},
    )
    slurm.wait("the first job to run", lambda: slurm.job_state(job_id(running)) == "RUNNING")
    waiting = submit(
        env, tmp_path, "waiting", "echo second", overrides={"resources": {"gpu_count": 1}}
    )
    slurm.wait("the second job to wait", lambda: slurm.job_state(job_id(waiting)) == "PENDING")
    seen: dict[str, Any] = {}

    def look_while_down() -> None:
        for run in (running, waiting):
            seen[run["id"]] = orbit_json(env, "status", run["id"])

    slurm.restart_controller(look_while_down)
    # while slurmctld was away, neither run was judged lost or ended: each kept its state,
    # marked as a host that does not answer is, with Slurm's own words
    for shown in seen.values():
        attempts = [(a["state"], a["reason"]) for a in shown["attempts"]]
        assert len(attempts) == 1 and attempts[0][1] == "host_unreachable", shown["attempts"]
        assert attempts[0][0] not in ("failed", "terminated", "succeeded")
        assert "squeue failed" in shown["attempts"][0]["message"]
    assert slurm.job_state(job_id(running)) == "RUNNING"  # recovered from its state
    assert slurm.job_state(job_id(waiting)) == "PENDING"
    go.touch()
    assert "finished" in orbit(env, "logs", running["id"], "--follow").stdout
    assert "second" in orbit(env, "logs", waiting["id"], "--follow").stdout
    for run in (running, waiting):
        shown = orbit_json(env, "runs", "show", run["id"])
        assert [a["state"] for a in shown["attempts"]] == ["succeeded"], [
            (a["reason"], a["message"]) for a in shown["attempts"]
        ]
        assert job_id(shown) == job_id(run)


def test_a_node_set_down_is_node_lost_and_retried_per_policy(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path
) -> None:
    add_cluster(env, slurm, tmp_path)
    marker = tmp_path / "first-ran"
    run = submit(
        env,
        tmp_path,
        "job",
        f"if [ -e {marker} ]; then echo retried; else touch {marker}; sleep 600; fi",
        retry={"max_retries": 1, "backoff_s": 0},
    )
    slurm.wait("the first attempt's task", marker.exists)
    slurm.set_node("down", "disk gone")
    slurm.wait("the job to end", lambda: job_id(run) not in slurm.queue())
    assert slurm.job_state(job_id(run)) in ("", "NODE_FAIL")  # forgotten, or as it ended

    last: dict[str, Any] = {}

    def retried() -> bool:
        last.update(orbit_json(env, "status", run["id"]))
        return len(last["attempts"]) == 2

    try:
        slurm.wait("the retry", retried, timeout_s=120)
    except AssertionError as e:  # ORBIT's own last look beside Slurm's logs
        raise AssertionError(f"ORBIT's last look: {json.dumps(last, indent=1)}\n{e}") from None
    shown = orbit_json(env, "runs", "show", run["id"])
    first, second = shown["attempts"]
    assert (first["state"], first["reason"]) == ("terminated", "node_lost"), first
    assert "NODE_FAIL" in first["message"]
    assert second["trigger"] == "auto_retry" and job_id(shown, 1) != job_id(run)
    # the retry waits in Slurm for a node, saying why, until the admin brings it back
    # the node comes back by itself once its slurmd registers again (ReturnToService=2), and
    # the retry runs there
    assert "retried" in orbit(env, "logs", run["id"], "--follow", timeout=180).stdout
    ended = orbit_json(env, "runs", "show", run["id"])
    assert [a["state"] for a in ended["attempts"]] == ["terminated", "succeeded"]


@pytest.mark.parametrize("nodes", [1, 2])
def test_slurms_time_limit_ends_the_run_as_max_runtime_not_before_it(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path, nodes: int
) -> None:
    add_cluster(env, slurm, tmp_path, "here", *(["--partition", "multi"] if nodes > 1 else []))
    limit_s = 45
    run = submit(
        env,
        tmp_path,
        "job",
        "echo started; sleep 600",
        overrides={"max_runtime_s": limit_s, "stop_grace_s": 2, "num_nodes": nodes},
        retry={"max_retries": 1, "backoff_s": 0},
    )
    location = Path(run["attempts"][0]["handle"]["location"])
    script = (location / "scripts" / "slurm.sbatch").read_text()
    assert "#SBATCH --time=2" in script and "#SBATCH --signal=B:TERM@32" in script
    # nobody looks meanwhile: Slurm's own limit ends it, not the control plane's check
    slurm.wait("the time limit", lambda: job_id(run) not in slurm.queue(), timeout_s=240)
    shown = orbit_json(env, "runs", "show", run["id"])
    attempts = shown["attempts"]
    assert len(attempts) == 1, attempts  # a reason of its own: not retried
    attempt = attempts[0]
    assert (attempt["state"], attempt["reason"]) == ("terminated", "max_runtime"), attempt
    ran = datetime.fromisoformat(attempt["finished_at"]) - datetime.fromisoformat(
        attempt["started_at"]
    )
    assert ran.total_seconds() >= limit_s - 30, ran  # Slurm's margin, never the whole lead
    assert "started" in (location / "artifacts" / "training.log").read_text()
    for rank in range(1, nodes):  # the warning reached every rank, with its reason
        result = json.loads((location / "nodes" / str(rank) / "runtime/result.json").read_text())
        assert (result["state"], result["reason"]) == ("terminated", "max_runtime"), result
