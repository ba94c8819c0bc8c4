"""The kernel's limits on starting a program, checked at submit: a task whose argument list
and environment the system would refuse to exec is refused then, naming the field, rather
than accepted and then blamed on the task when the wrapper cannot start it.

Linux refuses an exec whose argument and environment strings (and their pointers) exceed
ARG_MAX, and any single string over MAX_ARG_STRLEN. What the host adds to the environment is
unknown here, so part of ARG_MAX is kept for it; what slips past all the same (a host with a
huge environment) ends the attempt as launch_failed, an infrastructure failure.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from orbit.model.errors import Refused
from orbit.model.models import ExecutionRequest, JobSpec

MAX_ARG_STRLEN = 131072  # Linux: 32 pages, the most one argument or "NAME=value" may hold
DEFAULT_ARG_MAX = 2 * 1024 * 1024  # Linux's with the usual 8 MiB stack
HOST_ENV_RESERVE = 128 * 1024  # the host's own environment and ORBIT's variables
POINTER = 8


def arg_max() -> int:
    try:
        found = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError):
        return DEFAULT_ARG_MAX
    return found if found > 0 else DEFAULT_ARG_MAX


def _size(text: str) -> int:
    return len(text.encode("utf-8", errors="surrogateescape")) + 1  # with its NUL


def _field(arg: str, task_request: Mapping[str, Any]) -> str:
    """The task field an argument came from, as a user wrote it: task.command, task.args.2."""
    for key, value in task_request.items():
        if value == arg:
            return f"task.{key}"
        if isinstance(value, list) and arg in value:
            return f"task.{key}.{value.index(arg)}"
    return "task"


def check_exec_limits(job: JobSpec, request: ExecutionRequest, limit: int | None = None) -> None:
    """Refuse a job whose entrypoint and env the system could not exec (see the module)."""
    task_env = job.task_request.get("env") or {}
    parts = [(_field(arg, job.task_request), _size(arg)) for arg in job.entrypoint]
    for name, value in job.env.items():
        where = (
            "runtime_env" if name in request.runtime_env and name not in task_env else "task.env"
        )
        parts.append((f"{where}.{name}", _size(f"{name}={value}")))
    for field, size in parts:
        if size > MAX_ARG_STRLEN:
            raise Refused(
                f"{field}: one string of {size - 1} bytes, and Linux starts no program with an "
                f"argument or environment entry over {MAX_ARG_STRLEN - 1} bytes "
                "(MAX_ARG_STRLEN): pass it in a file instead"
            )
    # a docker launch passes the env twice: to the `docker run` client's environment and as
    # its -e arguments
    env_copies = 2 if job.launch_mode.kind == "docker" else 1
    total = sum(size + POINTER for _, size in parts[: len(job.entrypoint)])
    total += env_copies * sum(size + POINTER for _, size in parts[len(job.entrypoint) :])
    whole = arg_max() if limit is None else limit
    budget = whole - HOST_ENV_RESERVE
    if total > budget:
        field, size = max(parts, key=lambda part: part[1])
        raise Refused(
            f"{field}: the task's arguments and environment come to {total} bytes, over the "
            f"{budget} a program can be started with here (ARG_MAX {whole}, less "
            f"{HOST_ENV_RESERVE} kept for the host's own environment); {field} is the largest "
            f"part ({size - 1} bytes): pass it in a file instead"
        )
