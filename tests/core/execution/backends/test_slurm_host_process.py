"""The Slurm placement against a real slurmctld + slurmd on this machine (tests/slurm.py): a
cluster registered as a local submit host, runs submitted through the `orbit` CLI."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import ORBIT, eventually, orbit, orbit_json, write_spec
from tests.slurm import GPU_TYPE, NODES, SlurmCluster


@pytest.fixture
def env(orbit_home: Path, tmp_path: Path, slurm: SlurmCluster) -> dict[str, str]:
    return {
        **os.environ,
        "ORBIT_HOME": str(orbit_home),
        "ORBIT_DATABASE_URL": f"sqlite:///{tmp_path / 'orbit.db'}",
        "COLUMNS": "200",
    }


def add_cluster(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path, name: str = "here", *extra: str
) -> dict[str, Any]:
    return dict(
        orbit_json(
            env,
            "clusters",
            "add",
            name,
            "--local",
            "--slurm-conf",
            str(slurm.conf),
            "--work-dir",
            str(tmp_path / "cluster-work"),
            *extra,
        )
    )


def spec(
    tmp_path: Path,
    command: str,
    target: str = "here",
    retry: dict[str, Any] | None = None,
    **overrides: Any,
) -> Path:
    """A `slurm` template spec of `command` on cluster `target` (its retry policy, if given)."""
    folder = tmp_path / "job"
    folder.mkdir(exist_ok=True)
    return write_spec(
        folder,
        template="slurm",
        task={"command": command},
        overrides={"target": target, **overrides},
        **({"retry": retry} if retry is not None else {}),
    )


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def job_id(run: dict[str, Any], attempt: int = 0) -> str:
    return str(run["attempts"][attempt]["handle"]["data"]["job_id"])


def test_clusters_check_records_partitions_nodes_gres_limits_and_version(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path
) -> None:
    added = add_cluster(env, slurm, tmp_path)
    facts = added["facts"]
    assert facts["version"] == slurm.version and facts["source"] == "sinfo --json"
    assert [n["gpus"] for n in facts["nodes"]] == [{GPU_TYPE: 2}, {GPU_TYPE: 2}]
    parts = {p["name"]: p for p in facts["partitions"]}
    assert parts["debug"]["default"] and parts["debug"]["max_time_s"] is None
    assert parts["short"]["max_time_s"] == 300 and parts["proj"]["allow_accounts"] == ["proj42"]
    assert parts["multi"]["nodes"] == list(NODES)
    assert all(p["nodes"] == [NODES[0]] for n, p in parts.items() if n != "multi")
    shown = orbit(env, "clusters", "show", "here").stdout
    assert f"GPUs per node 2 x {GPU_TYPE}" in shown and "time limit 00:05:00" in shown
    assert "here" in orbit(env, "clusters", "list").stdout
    assert orbit_json(env, "hosts", "list") == []  # one table, but a cluster is no host
    checked = orbit_json(env, "clusters", "check", "here")
    assert checked["facts"]["checked_at"] > facts["checked_at"]


def test_bad_cluster_input_is_one_line_naming_the_field_and_writes_nothing(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path
) -> None:
    both = orbit(env, "clusters", "add", "x", "--local", "--ssh", "login", check=False)
    assert "--local or --ssh" in one_line_error(both)
    word = orbit(env, "clusters", "add", "x", "--local", "--account", "a b", check=False)
    assert "account" in one_line_error(word)
    assert orbit_json(env, "clusters", "list") == []


def test_a_run_succeeds_with_its_logs_sbatch_script_and_manifest(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path
) -> None:
    add_cluster(env, slurm, tmp_path)
    command = 'echo "job=$SLURM_JOB_ID"; echo ok > "$ORBIT_ARTIFACTS_DIR/out.txt"'
    run = orbit_json(
        env,
        "submit",
        str(spec(tmp_path, command, resources={"gpu_count": 1, "gpu_type": "A100"})),
    )
    followed = orbit(env, "logs", run["id"], "--follow")
    assert f"job={job_id(run)}" in followed.stdout
    shown = orbit_json(env, "status", run["id"])
    assert shown["state"] == "succeeded"
    location = Path(run["attempts"][0]["handle"]["location"])
    script = (location / "scripts" / "slurm.sbatch").read_text()
    assert f"#SBATCH --gres=gpu:{GPU_TYPE}:1" in script
    assert f"#SBATCH --comment=orbit:run={run['id']},attempt={run['attempts'][0]['id']}" in script
    assert "#SBATCH --no-requeue" in script and "#SBATCH --signal=B:TERM@" in script
    assert "wrapper started" in orbit(env, "logs", run["id"], "--layer", "runtime").stdout
    last = followed.stdout.splitlines(keepends=True)[-1]
    assert orbit(env, "logs", run["id"], "--tail", "1").stdout == last
    assert (location / "artifacts" / "runtime-precheck.log").exists()
    assert (location / "artifacts" / "nvml-audit.jsonl").exists()
    dest = tmp_path / "collected"
    collected = orbit_json(env, "collect", run["id"], "--dest", str(dest))
    assert collected["verified"] is True and (dest / "out.txt").read_text() == "ok\n"
    source = json.loads((dest / "manifest.json").read_text())["run"]
    assert (source["run_id"], source["attempt_id"]) == (run["id"], run["attempts"][0]["id"])
    last = json.loads((location / "runtime" / "last_run.json").read_text())
    assert last["handle"]["slurm_job_id"] == job_id(run) and last["state"] == "succeeded"
    assert (dest / "manifest.json").exists()
    assert slurm.job_state(job_id(run)) == "COMPLETED"
    # the same bundle again: the cluster's copy is used as it is
    again = orbit_json(
        env,
        "submit",
        str(spec(tmp_path, command, resources={"gpu_count": 1, "gpu_type": "A100"})),
    )
    assert again["attempts"][0]["handle"]["data"]["bundle_cached"] is True


def test_requests_the_cluster_cannot_serve_are_refused_naming_partition_and_figures(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path
) -> None:
    add_cluster(env, slurm, tmp_path)
    add_cluster(env, slurm, tmp_path, "short", "--partition", "short")
    too_many = orbit(
        env, "submit", str(spec(tmp_path, "true", resources={"gpu_count": 3})), check=False
    )
    line = one_line_error(too_many)
    assert "partition debug" in line and "gpu_count 3" in line and "at most 2" in line
    wrong_type = orbit(
        env,
        "submit",
        str(spec(tmp_path, "true", resources={"gpu_count": 1, "gpu_type": "H100"})),
        check=False,
    )
    assert f"has {GPU_TYPE}, not resources.gpu_type H100" in one_line_error(wrong_type)
    too_long = orbit(
        env, "submit", str(spec(tmp_path, "true", "short", max_runtime_s=3600)), check=False
    )
    line = one_line_error(too_long)
    assert "partition short" in line and "3600" in line and "300s" in line
    assert orbit_json(env, "runs", "list") == []  # nothing was written
    assert slurm.queue() == []


def test_a_submission_slurm_refuses_fails_launch_failed_with_its_message(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path
) -> None:
    # unchecked: ORBIT cannot know the account is wrong, Slurm says so at sbatch
    add_cluster(
        env, slurm, tmp_path, "proj", "--partition", "proj", "--account", "bad", "--no-check"
    )
    run = orbit_json(env, "submit", str(spec(tmp_path, "true", "proj", {"max_retries": 0})))
    attempt = run["attempts"][0]
    assert attempt["state"] == "failed" and attempt["reason"] == "launch_failed"
    assert attempt["message"] == (
        "cluster 'proj' refused the job: Invalid account or account/partition combination specified"
    )
    assert slurm.queue() == []


def test_a_refused_submission_of_a_run_with_secrets_leaves_none_of_their_files(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path
) -> None:
    add_cluster(
        env, slurm, tmp_path, "proj", "--partition", "proj", "--account", "bad", "--no-check"
    )
    subprocess.run(
        [*ORBIT, "secrets", "set", "hf"], env=env, input="hf_Refused_0a1b2c3d4e", text=True,
        check=True, capture_output=True,
    )  # fmt: skip
    path = spec(tmp_path, "true", "proj", {"max_retries": 0})
    path.write_text(path.read_text() + "secrets: {HF_TOKEN: hf}\n")
    run = orbit_json(env, "submit", str(path))
    attempt = run["attempts"][0]
    assert attempt["reason"] == "launch_failed" and "refused the job" in attempt["message"]
    location = tmp_path / "cluster-work" / "attempts" / attempt["id"]
    assert (location / "scripts" / "slurm.sbatch").is_file()  # staged, then refused
    assert not (location / "secrets").exists()


def test_a_pending_job_is_provisioning_with_slurms_reason_and_estimated_start(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path
) -> None:
    add_cluster(env, slurm, tmp_path)
    # a blocker with a time limit: Slurm's backfill can say when the run would start
    blocker = slurm.sbatch(f"--gres=gpu:{GPU_TYPE}:2", "--time=10", "--wrap", "sleep 600")
    slurm.wait("the blocker to run", lambda: slurm.job_state(blocker) == "RUNNING")
    run = orbit_json(env, "submit", str(spec(tmp_path, "true", resources={"gpu_count": 1})))

    def provisioning() -> dict[str, Any] | None:
        shown: dict[str, Any] = orbit_json(env, "status", run["id"])
        return shown if shown["state"] == "provisioning" else None

    shown = eventually(provisioning, timeout=60, every=0.5)
    message = shown["attempts"][0]["message"]
    assert message.startswith(f"pending in Slurm as job {job_id(run)} (Resources)"), message
    assert "Resources" in orbit(env, "status", run["id"]).stdout

    def estimated() -> str | None:
        text = str(orbit_json(env, "status", run["id"])["attempts"][0]["message"])
        return text if "; estimated start " in text else None

    # about when the blocker's 10 minutes are up (Slurm's estimate, in its local time)
    when = eventually(estimated, timeout=60, every=0.5).split("; estimated start ")[1]
    start = slurm.run("scontrol", "-o", "show", "job", blocker).stdout.split("StartTime=")[1]
    expected = datetime.fromisoformat(start.split()[0]) + timedelta(minutes=10)
    assert abs((datetime.fromisoformat(when) - expected).total_seconds()) <= 120, (when, start)
    assert "estimated start" in orbit(env, "status", run["id"]).stdout
    slurm.run("scancel", blocker)
    orbit(env, "logs", run["id"], "--follow", timeout=120)
    assert orbit_json(env, "status", run["id"])["state"] == "succeeded"


def test_a_pending_jobs_message_follows_slurms_reason_while_it_waits(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path
) -> None:
    add_cluster(env, slurm, tmp_path)
    blocker = slurm.sbatch(f"--gres=gpu:{GPU_TYPE}:2", "--wrap", "sleep 600")
    slurm.wait("the blocker to run", lambda: slurm.job_state(blocker) == "RUNNING")
    run = orbit_json(env, "submit", str(spec(tmp_path, "true", resources={"gpu_count": 1})))
    job = job_id(run)

    def message_with(reason: str) -> str | None:
        shown: dict[str, Any] = orbit_json(env, "status", run["id"])
        attempt = shown["attempts"][0]
        assert attempt["state"] in ("submitted", "provisioning"), attempt
        text = attempt["message"] or ""
        return text if f"pending in Slurm as job {job} ({reason})" in text else None

    eventually(lambda: message_with("Resources"), timeout=60, every=0.5)
    slurm.run("scontrol", "hold", job)  # an admin holds it: Slurm's reason changes
    eventually(lambda: message_with("JobHeldAdmin"), timeout=60, every=0.5)
    assert "JobHeldAdmin" in orbit(env, "status", run["id"]).stdout
    slurm.run("scontrol", "release", job)
    eventually(lambda: message_with("Resources"), timeout=60, every=0.5)
    slurm.run("scancel", blocker)
    orbit(env, "logs", run["id"], "--follow", timeout=120)
    assert orbit_json(env, "status", run["id"])["state"] == "succeeded"


def test_cancel_stops_the_job_gracefully_and_nothing_stays_in_the_queue(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path
) -> None:
    add_cluster(env, slurm, tmp_path)
    command = "trap 'echo got TERM; exit 3' TERM; echo started; while :; do sleep 0.1; done"
    run = orbit_json(env, "submit", str(spec(tmp_path, command)))
    location = Path(run["attempts"][0]["handle"]["location"])
    eventually(
        lambda: (
            "started" in (location / "artifacts" / "training.log").read_text(errors="replace")
            if (location / "artifacts" / "training.log").exists()
            else None
        ),
        timeout=60,
    )
    cancelled = orbit_json(env, "cancel", run["id"])
    attempt = cancelled["attempts"][0]
    assert attempt["state"] == "terminated" and attempt["reason"] == "cancelled"
    assert "got TERM" in (location / "artifacts" / "training.log").read_text()
    slurm.wait("the cancelled job to leave the queue", lambda: not slurm.queue())
    assert len(orbit_json(env, "runs", "show", run["id"])["attempts"]) == 1  # not retried


def test_a_job_scancelled_from_outside_is_reported_and_retried(
    env: dict[str, str], slurm: SlurmCluster, tmp_path: Path
) -> None:
    add_cluster(env, slurm, tmp_path)
    marker = tmp_path / "first-done"
    # the first attempt waits to be killed; the retry finds the marker and ends at once
    command = f"if [ -e {marker} ]; then echo retried; else touch {marker}; sleep 600; fi"
    path = spec(tmp_path, command, retry={"max_retries": 1, "backoff_s": 0})
    run = orbit_json(env, "submit", str(path))
    first = job_id(run)
    eventually(lambda: marker.exists(), timeout=60)
    slurm.run("scancel", first)
    ended = orbit(env, "logs", run["id"], "--follow", timeout=180)
    assert "retried" in ended.stdout
    shown = orbit_json(env, "runs", "show", run["id"])
    assert [a["state"] for a in shown["attempts"]] == ["terminated", "succeeded"]
    assert shown["attempts"][0]["reason"] == "preempted"
    assert job_id(shown, 1) != first
