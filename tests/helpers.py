"""Small helpers shared by the service and CLI tests: spec files and polling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from orbit.model.models import ExecutionRequest, LaunchMode, Placement, Resources, TaskSubmission

T = TypeVar("T")
ORBIT = [sys.executable, "-m", "orbit"]
HAVE_PROC = Path("/proc/self/stat").exists()


def write_spec(folder: Path, name: str = "spec.yaml", **fields: Any) -> Path:
    """A SPEC.yaml for `orbit submit`; defaults to a quick `command` task on the local template."""
    data: dict[str, Any] = {
        "experiment": "exp",
        "task_type": "command",
        "template": "local",
        "task": {"command": "echo hello"},
    }
    data.update(fields)
    path = folder / name
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def eventually(check: Callable[[], T | None], timeout: float = 20.0, every: float = 0.05) -> T:
    """Poll `check` until it returns something truthy, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {value!r})")
        time.sleep(every)


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, process group) from /proc, or None once the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[2])


def process_alive(pid: int) -> bool:
    """Alive and not a zombie: where init does not reap orphans, a dead one lingers as Z."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    if not HAVE_PROC:
        return True
    found = _proc_stat(pid)
    return found is not None and found[0] != "Z"


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process remains in the process group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    if not HAVE_PROC:
        return True
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            found = _proc_stat(int(entry.name))
            if found and found[1] == pgid and found[0] != "Z":
                return True
    return False


def orbit(
    env: dict[str, str], *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The `orbit` CLI as a process, as a user runs it; with `check`, a non-zero exit fails."""
    proc = subprocess.run([*ORBIT, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"orbit {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def orbit_json(env: dict[str, str], *args: str) -> Any:
    return json.loads(orbit(env, *args, "--json").stdout)


def sqlite_env(orbit_home: Path, database: Path) -> dict[str, str]:
    """The environment of a CLI run against a private ORBIT home and a SQLite store."""
    return {
        **os.environ,
        "ORBIT_HOME": str(orbit_home),
        "ORBIT_DATABASE_URL": f"sqlite:///{database}",
        "COLUMNS": "200",
    }


def a_request(
    backend_key: str = "local_host_process", target: str | None = None, **fields: Any
) -> ExecutionRequest:
    """A whole execution request for a run a test writes into the store itself: its
    placement and launch mode are `backend_key`'s (`agent_pool_host_process`, say)."""
    mode = "docker" if backend_key.endswith("_docker") else "host_process"
    placement = backend_key.removesuffix(f"_{mode}")
    return ExecutionRequest(
        template_id=fields.pop("template_id", "local"),
        placement=Placement(kind=placement),
        launch_mode=LaunchMode(kind=mode),
        target=target,
        detach=fields.pop("detach", True),
        resources=fields.pop("resources", Resources()),
        runtime_env=fields.pop("runtime_env", {}),
        stop_grace_s=fields.pop("stop_grace_s", 10.0),
        **fields,
    )


def a_submission(**fields: Any) -> TaskSubmission:
    """A submission for a run a test writes into the store itself (`true` as a command)."""
    return TaskSubmission(
        experiment_id=fields.pop("experiment_id", "exp-tests"),
        task_type=fields.pop("task_type", "command"),
        task_request=fields.pop("task_request", {"command": "true"}),
        template_id=fields.pop("template_id", "local"),
        **fields,
    )
