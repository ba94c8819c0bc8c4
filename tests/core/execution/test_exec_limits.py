"""Argument lists the system would refuse to exec: refused at submit naming the field (exit 2,
nothing written), and what slips past all the same ends as launch_failed, not as the task's
failure. Through the `orbit` CLI as a real process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orbit.core.execution.exec_limits import (
    HOST_ENV_RESERVE,
    MAX_ARG_STRLEN,
    arg_max,
    check_exec_limits,
)
from orbit.model.errors import Refused
from orbit.model.models import ExecutionRequest, JobSpec, LaunchMode, Placement, Resources
from tests.helpers import orbit, sqlite_env, write_spec

KIB = 1024


@pytest.fixture
def env(orbit_home: Path, tmp_path: Path) -> dict[str, str]:
    return sqlite_env(orbit_home, tmp_path / "orbit.db")


def refused(env: dict[str, str], spec: Path) -> str:
    proc = orbit(env, "submit", str(spec), check=False)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orbit: error: "), proc.stderr
    listed = orbit(env, "runs", "list", "--json")
    assert json.loads(listed.stdout) == []  # nothing written: no run, no bundle
    bundles = Path(env["ORBIT_HOME"]) / "bundles"
    assert not bundles.exists() or not [p for p in bundles.iterdir() if p.name[0] != "."]
    return lines[0].removeprefix("orbit: error: ")


def test_one_argument_over_max_arg_strlen_is_refused_at_submit(
    env: dict[str, str], tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, task={"command": "echo " + "x" * 200_000})
    line = refused(env, spec)
    assert line.startswith("task.command: one string of 200005 bytes"), line
    assert "MAX_ARG_STRLEN" in line
    args = write_spec(
        tmp_path,
        name="python.yaml",
        task_type="python",
        task={"script": "train.py", "args": ["--lr", "1e-4", "y" * 150_000]},
    )
    (tmp_path / "train.py").write_text("print('never')\n")
    assert refused(env, args).startswith("task.args.2: one string of 150000 bytes")


def test_an_argument_list_and_env_over_arg_max_is_refused_at_submit(
    env: dict[str, str], tmp_path: Path
) -> None:
    count = arg_max() // (100 * KIB) + 1  # each under MAX_ARG_STRLEN, over ARG_MAX together
    big = {f"PART_{n:02d}": "v" * (100 * KIB) for n in range(count)}
    big["PART_00"] += "v" * KIB  # the largest part is named
    spec = write_spec(tmp_path, task={"command": "true", "env": big})
    line = refused(env, spec)
    assert line.startswith("task.env.PART_00: the task's arguments and environment come to "), line
    assert f"ARG_MAX {arg_max()}" in line


def test_what_slips_past_on_the_host_is_launch_failed_not_the_tasks_failure(
    env: dict[str, str], tmp_path: Path
) -> None:
    """The job fits, but this host's own environment is large: together they do not."""
    limit = arg_max()
    job_env = {f"JOB_{n}": "j" * (100 * KIB) for n in range(limit // 3 // (100 * KIB))}
    host_env = {f"HOST_{n}": "h" * (100 * KIB) for n in range(limit * 3 // 4 // (100 * KIB))}
    spec = write_spec(tmp_path, task={"command": "echo never", "env": job_env})
    proc = orbit({**env, **host_env}, "submit", str(spec), "--wait", "--json", check=False)
    run = json.loads(proc.stdout)
    attempt = run["attempts"][0]
    assert run["state"] == "failed", proc.stderr
    assert attempt["reason"] == "launch_failed" and attempt["failure_kind"] == "infrastructure"
    assert "Argument list too long" in attempt["message"]


def job(entrypoint: tuple[str, ...], env: dict[str, str], kind: str = "host_process") -> JobSpec:
    return JobSpec(
        task_type="command",
        template_id="t",
        launch_mode=LaunchMode(kind=kind),
        entrypoint=entrypoint,
        env=env,
        task_request={"command": list(entrypoint), "env": {"TASK": "1"}},
    )


def request(runtime_env: dict[str, str]) -> ExecutionRequest:
    return ExecutionRequest(
        template_id="t",
        placement=Placement(kind="local"),
        launch_mode=LaunchMode(kind="host_process"),
        target=None,
        detach=True,
        resources=Resources(),
        runtime_env=runtime_env,
        stop_grace_s=10,
    )


def test_the_limits_name_the_field_a_user_wrote() -> None:
    exact = "a" * (MAX_ARG_STRLEN - 1)  # with its NUL, exactly the limit: allowed
    check_exec_limits(job(("echo", exact), {}), request({}))
    with pytest.raises(Refused, match=r"^task\.command\.1: one string of 131072 bytes"):
        check_exec_limits(job(("echo", exact + "a"), {}), request({}))
    runtime = {"FROM_TEMPLATE": "r" * 200_000}
    with pytest.raises(Refused, match=r"^runtime_env\.FROM_TEMPLATE: one string"):
        check_exec_limits(job(("true",), runtime), request(runtime))
    # a docker launch passes the env twice: what fits a host process may not fit a container
    env = {"E": "e" * 60 * KIB}
    limit = HOST_ENV_RESERVE + 100 * KIB
    check_exec_limits(job(("true",), env), request({}), limit=limit)
    with pytest.raises(Refused, match=r"^task\.env\.E: the task's arguments"):
        check_exec_limits(job(("true",), env, kind="docker"), request({}), limit=limit)
