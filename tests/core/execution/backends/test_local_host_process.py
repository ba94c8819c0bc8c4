"""`local_host_process` as a user drives it: the `orbit` CLI as a real process, the attempt a
real detached process tree on this machine."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from tests.helpers import eventually, orbit, orbit_json, process_alive, sqlite_env, write_spec

from orbit.core.execution.local_env import without_venv


@pytest.fixture
def env(orbit_home: Path, tmp_path: Path) -> dict[str, str]:
    return sqlite_env(orbit_home, tmp_path / "orbit.db")


# --- nothing of an ended attempt keeps running -------------------------------------------------


def test_a_child_that_left_the_process_group_is_stopped_when_the_task_ends(
    env: dict[str, str], tmp_path: Path
) -> None:
    """tensorboard, `vllm serve`: started in a session of their own, they escape the task's
    process group, but not its environment marker."""
    command = (
        "setsid bash -c 'while true; do echo tick; sleep 0.1; done' & "
        'echo $! > "$ORBIT_ARTIFACTS_DIR/child.pid"; sleep 0.5; echo done'
    )
    spec = write_spec(tmp_path, task={"command": command})
    run = orbit_json(env, "submit", str(spec), "--wait")
    assert run["state"] == "succeeded", run["attempts"][0]
    location = Path(run["attempts"][0]["handle"]["location"])
    child = int((location / "artifacts" / "child.pid").read_text())
    assert not process_alive(child)
    log = location / "artifacts" / "training.log"
    size = log.stat().st_size
    time.sleep(0.5)
    assert log.stat().st_size == size and "tick" in log.read_text()
    assert "leftover process" in (location / "runtime" / "runtime.log").read_text()
    collected = orbit_json(env, "collect", run["id"], "--dest", str(tmp_path / "out"))
    assert collected["verified"] is True and collected["problems"] == []


def test_a_vanished_wrappers_escaped_children_go_with_it(
    env: dict[str, str], tmp_path: Path
) -> None:
    """The wrapper is SIGKILLed: nobody is left to stop its task; the look that finds it gone
    (runtime_lost) stops everything that carries the attempt's marker."""
    command = 'setsid sleep 300 & echo $! > "$ORBIT_ARTIFACTS_DIR/child.pid"; sleep 300'
    spec = write_spec(tmp_path, task={"command": command}, retry={"max_retries": 0})
    run = orbit_json(env, "submit", str(spec))
    location = Path(run["attempts"][0]["handle"]["location"])
    child_file = location / "artifacts" / "child.pid"
    eventually(lambda: child_file.exists() and child_file.read_text().strip())
    child = int(child_file.read_text())
    os.kill(int((location / "runtime" / "pid").read_text()), signal.SIGKILL)
    ended = eventually(
        lambda: (r := orbit_json(env, "status", run["id"]))["state"] == "failed" and r
    )
    assert ended["attempts"][0]["reason"] == "runtime_lost"
    assert not process_alive(child)


# --- the task's environment -------------------------------------------------------------------


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="the tests do not run from a venv")
def test_a_tasks_python3_is_not_orbits_own_venv(env: dict[str, str], tmp_path: Path) -> None:
    """ORBIT's venv first on PATH, as when it is activated: the task's `python3` is still the
    one the user has without ORBIT (the wrapper runs all the same, with ORBIT's interpreter)."""
    venv = sys.prefix
    activated = {
        **env,
        "PATH": f"{venv}/bin{os.pathsep}{env['PATH']}",
        "VIRTUAL_ENV": venv,
    }
    spec = write_spec(
        tmp_path,
        task={"command": 'python3 -c "import sys; print(sys.prefix)"; echo "venv=$VIRTUAL_ENV"'},
    )
    run = orbit_json(activated, "submit", str(spec), "--wait")
    assert run["state"] == "succeeded", run["attempts"][0]
    prefix, venv_line = orbit(activated, "logs", run["id"]).stdout.splitlines()
    assert os.path.realpath(prefix) != os.path.realpath(venv)
    assert venv_line == "venv="


def test_only_orbits_venv_leaves_the_environment() -> None:
    environ = {
        "PATH": "/opt/orbit-venv/bin:/home/u/.venv/bin:/usr/bin:/opt/orbit-venv/bin/",
        "VIRTUAL_ENV": "/opt/orbit-venv",
        "HOME": "/home/u",
    }
    cleaned = without_venv(environ, "/opt/orbit-venv")
    assert cleaned == {"PATH": "/home/u/.venv/bin:/usr/bin", "HOME": "/home/u"}
    own = {**environ, "VIRTUAL_ENV": "/home/u/.venv"}  # the user's own activated venv stays
    assert without_venv(own, "/opt/orbit-venv")["VIRTUAL_ENV"] == "/home/u/.venv"
    assert without_venv(environ, None) == environ


# --- GPUs -------------------------------------------------------------------------------------


def submit_refused(env: dict[str, str], tmp_path: Path, *sets: str) -> str:
    spec = write_spec(tmp_path, task={"command": "nvidia-smi"})
    args = [item for s in sets for item in ("--set", s)]
    proc = orbit(env, "submit", str(spec), *args, check=False)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orbit: error: "), proc.stderr
    assert orbit_json(env, "runs", "list") == []  # nothing written
    assert not (Path(env["ORBIT_HOME"]) / "bundles").exists() or not any(
        (Path(env["ORBIT_HOME"]) / "bundles").iterdir()
    )
    return lines[0].removeprefix("orbit: error: ")


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_gpus_this_machine_does_not_have_are_refused_at_submit(
    env: dict[str, str], tmp_path: Path
) -> None:
    assert submit_refused(env, tmp_path, "resources.gpu_count=1") == (
        "resources.gpu_count: 1 requested, this machine has 0 GPUs (nvidia-smi: not found)"
    )
    assert "resources.gpu_count: 64 requested" in submit_refused(
        env, tmp_path, "resources.gpu_count=64", "resources.gpu_type=H100"
    )
