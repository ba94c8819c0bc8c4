"""Run dependencies on a Slurm cluster (a real slurmctld + slurmd here, tests/slurm.py): the
gate is ORBIT's, before `sbatch`, so a run whose `after.ok` dependency has not ended is no job
in Slurm's queue at all, and becomes one once the dependency has succeeded."""

from __future__ import annotations

from pathlib import Path

from tests.core.execution.backends.test_slurm_host_process import add_cluster, env, spec
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.slurm import SlurmCluster

__all__ = ["env"]


def queued(slurm: SlurmCluster) -> str:
    """The names of the jobs in Slurm's queue."""
    return slurm.run("squeue", "-h", "-o", "%j").stdout


def test_a_slurm_run_is_no_job_until_its_dependency_succeeded(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path
) -> None:
    add_cluster(env, slurm, tmp_path)
    flag = tmp_path / "go"
    first = orbit_json(
        env,
        "submit",
        str(write_spec(tmp_path, task={"command": f"while [ ! -e {flag} ]; do sleep 0.1; done"})),
    )["id"]
    then = orbit_json(env, "submit", str(spec(tmp_path, "echo ran in slurm")), "--after", first)
    assert then["state"] == "prepared" and then["attempts"][0]["handle"] is None
    assert orbit_json(env, "status", then["id"])["attempts"][0]["held"] == "after"
    assert f"orbit-{then['id']}" not in queued(slurm)

    flag.touch()
    done = eventually(
        lambda: (r := orbit_json(env, "status", then["id"]))["state"] == "succeeded" and r,
        timeout=90,
        every=0.5,
    )
    assert done["attempts"][0]["handle"]["data"]["job_id"]
    assert orbit(env, "logs", then["id"]).stdout == "ran in slurm\n"
