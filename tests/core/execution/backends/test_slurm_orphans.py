"""`orbit clusters check` lists ORBIT's jobs in the cluster's queue that the control plane does
not know, and cancels them only with --sweep; jobs without both ORBIT marks, and another control
plane's, are never touched. Against the real private Slurm (tests/slurm.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.core.execution.backends.test_slurm_host_process import add_cluster, job_id, spec
from tests.helpers import orbit, orbit_json
from tests.slurm import SlurmCluster


def env_for(home: Path, database: Path) -> dict[str, str]:
    home.mkdir(exist_ok=True)
    return {
        **os.environ,
        "ORBIT_HOME": str(home),
        "ORBIT_DATABASE_URL": f"sqlite:///{database}",
        "COLUMNS": "200",
    }


def test_orbit_jobs_unknown_to_the_store_are_listed_and_cancelled_only_with_sweep(
    orbit_home: Path, tmp_path: Path, slurm: SlurmCluster
) -> None:
    first = env_for(orbit_home, tmp_path / "first.db")
    add_cluster(first, slurm, tmp_path)
    run = orbit_json(first, "submit", str(spec(tmp_path, "sleep 600", retry={"max_retries": 0})))
    attempt, job = run["attempts"][0]["id"], job_id(run)
    slurm.wait("ORBIT's job to run", lambda: slurm.job_state(job) == "RUNNING")
    # not ORBIT's: no marks, ORBIT's name without its comment, marks that disagree
    foreign = [
        slurm.sbatch("--wrap", "sleep 600"),
        slurm.sbatch("-J", f"orbit-{attempt}", "--wrap", "sleep 600"),
        slurm.sbatch(
            "-J", "orbit-other", f"--comment=orbit:run={run['id']},attempt={attempt}",
            "--wrap", "sleep 600",
        ),
    ]  # fmt: skip

    # the control plane that submitted it knows it: nothing to list
    known = orbit_json(first, "clusters", "check", "here")
    assert known["orphans"] == [] and known["facts"] is not None

    # the same control plane (same ORBIT home) with its store lost: an orphan
    lost = env_for(orbit_home, tmp_path / "lost.db")
    add_cluster(lost, slurm, tmp_path)
    listed = orbit_json(lost, "clusters", "check", "here")
    orphan = {
        "job_id": job,
        "state": "RUNNING",
        "run_id": run["id"],
        "attempt_id": attempt,
        "why": "unknown",
        "cancelled": False,
    }
    assert [{k: o[k] for k in orphan} for o in listed["orphans"]] == [orphan]
    assert listed["swept"] is False
    text = orbit(lost, "clusters", "check", "here").stdout
    assert job in text and "orbit clusters check here --sweep" in text
    assert slurm.job_state(job) == "RUNNING"  # listed, left alone

    # another control plane (another ORBIT home) sees it as not its own: listed, never swept
    other = env_for(tmp_path / "other-home", tmp_path / "other.db")
    add_cluster(other, slurm, tmp_path)
    seen = orbit_json(other, "clusters", "check", "here", "--sweep")
    assert [(o["job_id"], o["why"], o["cancelled"]) for o in seen["orphans"]] == [
        (job, "other_plane", False)
    ]
    assert slurm.job_state(job) == "RUNNING"

    swept = orbit_json(lost, "clusters", "check", "here", "--sweep")
    assert [(o["job_id"], o["cancelled"]) for o in swept["orphans"]] == [(job, True)]
    slurm.wait("the orphan to leave the queue", lambda: job not in slurm.queue())
    assert all(slurm.job_state(j) == "RUNNING" for j in foreign)
    assert sorted(slurm.queue()) == sorted(foreign)
    events: list[dict[str, Any]] = orbit_json(lost, "audit")
    swept_events = [e for e in events if e["action"] == "cluster.swept"]
    assert [e["data"]["jobs"] for e in swept_events] == [[job]], swept_events
    # once swept, nothing is left to list
    assert orbit_json(lost, "clusters", "check", "here")["orphans"] == []
