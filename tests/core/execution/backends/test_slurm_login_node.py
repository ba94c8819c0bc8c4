"""The login-node case: a Slurm cluster reached only through SSH (`orbit clusters add --ssh`),
against the real private Slurm (tests/slurm.py) behind a real sshd on loopback (tests/sshd.py):
every Slurm command, the staging (rsync), the logs and collect go through the login node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.core.execution.backends.test_slurm_host_process import job_id, spec
from tests.helpers import orbit, orbit_json
from tests.slurm import GPU_TYPE, NODES, SlurmCluster
from tests.sshd import SshdFactory, SshServer


def add_through(
    env: dict[str, str], login: SshServer, slurm: SlurmCluster, work: Path, *extra: str
) -> dict[str, Any]:
    """Cluster `hpc`, reached through the login node `login` (an sshd of the fixture)."""
    add = ["clusters", "add", "hpc", "--ssh", login.alias, "--work-dir", str(work), *extra]
    return dict(orbit_json(env, *add, "--slurm-conf", str(slurm.conf)))


def test_a_run_through_the_login_node_succeeds_is_collected_and_cached(
    env: dict[str, str], sshd_factory: SshdFactory, slurm: SlurmCluster, tmp_path: Path
) -> None:
    login = sshd_factory(alias="login")
    work = login.work_root / "orbit"
    added = add_through(env, login, slurm, work)
    assert added["spec"]["ssh"]["ssh"] == login.alias
    assert [n["gpus"] for n in added["facts"]["nodes"]] == [{GPU_TYPE: 2}] * len(NODES)
    assert added["facts"]["work_dir"] == str(work)
    shown = orbit(env, "clusters", "list").stdout
    assert "hpc" in shown and login.alias in shown

    def submit() -> dict[str, Any]:
        command = 'echo "job=$SLURM_JOB_ID"; echo payload > "$ORBIT_ARTIFACTS_DIR/d"'
        path = spec(tmp_path, command, "hpc", resources={"gpu_count": 1})
        return dict(orbit_json(env, "submit", str(path)))

    run = submit()
    data = run["attempts"][0]["handle"]["data"]
    assert data["host"]["ssh"] == login.alias  # logs and files are read over SSH
    assert data["staged_bytes"] > 0 and data["bundle_cached"] is False
    followed = orbit(env, "logs", run["id"], "--follow", timeout=180)
    assert f"job={job_id(run)}" in followed.stdout
    assert orbit_json(env, "status", run["id"])["state"] == "succeeded"
    assert slurm.job_state(job_id(run)) == "COMPLETED"
    location = Path(run["attempts"][0]["handle"]["location"])
    assert location.is_relative_to(work)  # the login node's work dir, which the node shares
    assert "#SBATCH --gres=gpu:1" in (location / "scripts" / "slurm.sbatch").read_text()
    dest = tmp_path / "collected"
    collected = orbit_json(env, "collect", run["id"], "--dest", str(dest))
    assert collected["verified"] is True and (dest / "d").read_text() == "payload\n"
    # the same bundle again: the cluster's copy serves, nothing moves
    again = submit()["attempts"][0]["handle"]["data"]
    assert again["bundle_cached"] is True and again["staged_bytes"] == 0
    checked = orbit_json(env, "clusters", "check", "hpc", "--sweep")
    assert checked["orphans"] == [] and checked["sweep_error"] is None


def test_a_two_node_run_through_the_login_node_is_collected_with_each_rank(
    env: dict[str, str], sshd_factory: SshdFactory, slurm: SlurmCluster, tmp_path: Path
) -> None:
    login = sshd_factory(alias="login")
    add_through(env, login, slurm, login.work_root / "orbit", "--partition", "multi")
    command = 'echo "rank $ORBIT_NODE_RANK" > "$ORBIT_ARTIFACTS_DIR/rank.txt"'
    run = orbit_json(env, "submit", str(spec(tmp_path, command, "hpc", num_nodes=2)), "--wait")
    assert run["state"] == "succeeded", run["attempts"][0]
    dest = tmp_path / "collected"
    collected = orbit_json(env, "collect", run["id"], "--dest", str(dest))
    assert collected["verified"] is True and collected["problems"] == []
    assert (dest / "rank.txt").read_text() == "rank 0\n"
    assert (dest / "nodes" / "1" / "rank.txt").read_text() == "rank 1\n"


def test_a_login_node_that_does_not_answer_is_an_unreachable_host(
    env: dict[str, str], sshd_factory: SshdFactory, slurm: SlurmCluster, tmp_path: Path
) -> None:
    login = sshd_factory(alias="login")
    add_through(env, login, slurm, login.work_root)
    login.stop()
    # as with an SSH host that is away: the attempt waits for it, spending no retry
    run = orbit_json(env, "submit", str(spec(tmp_path, "true", "hpc", {"max_retries": 0})))
    attempt = run["attempts"][0]
    assert (attempt["state"], attempt["reason"]) == ("prepared", "host_unreachable"), attempt
    assert attempt["handle"] is None and slurm.queue() == []
    assert "waiting for its host" in orbit(env, "status", run["id"]).stdout
    checked = orbit(env, "clusters", "check", "hpc", check=False)
    assert checked.returncode != 0 and len(checked.stderr.strip().splitlines()) == 1
    login.start()
    orbit(env, "logs", run["id"], "--follow", timeout=180)
    done = orbit_json(env, "runs", "show", run["id"])
    assert [a["state"] for a in done["attempts"]] == ["succeeded"]
