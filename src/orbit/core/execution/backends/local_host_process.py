"""`local_host_process`: the attempt runs on this machine as a detached process."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from orbit.core.execution.backends.base import (
    AttemptContext,
    CopyArtifacts,
    LaunchError,
    attempt_env,
)
from orbit.core.execution.backends.local_files import LocalFiles
from orbit.core.execution.runtime_state import parse_json, status_from_files
from orbit.model.errors import Refused
from orbit.model.models import ExecutionRequest, FailureReason, RunHandle, RunStatus
from orbit.runtime import host_processes, hostside

if TYPE_CHECKING:  # launching and collecting load what they need; looking at a run does not
    from orbit.core.execution.bundle import FrozenBundle
    from orbit.model.records import CollectResult

LOCAL_TARGETS = {None, "localhost", "local"}


def wrapper_alive(runtime: Path) -> bool:
    """Whether the attempt's wrapper still holds runtime/lock (see orbit.runtime.hostside)."""
    return hostside.wrapper_alive(str(runtime))


class TaskUser(Protocol):
    """Who an attempt's wrapper and task run as, where that is not this process's user (an
    agent as root gives each attempt a user of its own: orbit.agent.isolation)."""

    def enter(self, attempt_dir: Path, env: dict[str, str]) -> tuple[dict[str, str], int, str]:
        """Hand the attempt's folder to its user: (more env, uid, the wrapper's python)."""
        ...

    def leave(self, attempt_dir: Path) -> None:
        """The attempt did not start: its user is free again."""
        ...


class LocalHostProcessBackend(LocalFiles):
    key = "local_host_process"
    pycache = False  # an attempt's copy takes the cache's .pyc files: only where no task
    # can write the cache (an agent whose tasks run as users of their own)
    cache_name = "this machine's"

    def __init__(self, work_dir: Path, task_user: TaskUser | None = None) -> None:
        self.work_dir = work_dir
        self.task_user = task_user

    def bundle_changed(self, bundle: FrozenBundle) -> None:
        """A cached bundle failed its digest check (a node drops its copy to fetch it anew;
        the control plane's own cache is the only copy there is: it stays, refused)."""

    def validate(self, request: ExecutionRequest) -> None:
        self.check_target(request)
        self.check_gpus(request)

    def check_target(self, request: ExecutionRequest) -> None:
        if request.target not in LOCAL_TARGETS:
            raise Refused(
                f"target '{request.target}' is not this machine: the '{request.template_id}' "
                "template runs locally (use a template with an ssh placement for other hosts)"
            )

    def check_gpus(self, request: ExecutionRequest) -> None:
        """GPUs this machine lacks are refused, as an SSH host's last check refuses them."""
        if request.resources.gpu_count > 0:
            from orbit.core.execution.local_gpus import check_local_gpus, local_gpus

            check_local_gpus(request, local_gpus())

    def launch_env(self) -> dict[str, str]:
        """More environment for the wrapper, from a launch mode that needs it."""
        return {}

    def launch(
        self, bundle: FrozenBundle, request: ExecutionRequest, attempt: AttemptContext
    ) -> RunHandle:
        from orbit.core.execution.bundle import BundleChanged, copy_frozen
        from orbit.core.execution.local_env import task_environ

        attempt_dir = self.work_dir / attempt.attempt_id
        try:
            copy_frozen(bundle, attempt_dir, self.pycache, self.cache_name)
        except BundleChanged as exc:
            self.bundle_changed(bundle)
            raise LaunchError(FailureReason.STAGING_FAILED, str(exc)) from None
        except OSError as exc:
            raise LaunchError(
                FailureReason.STAGING_FAILED, f"staging into {attempt_dir}: {exc}"
            ) from exc
        # the same start an SSH host makes; the job's own env is in job.json. The wrapper
        # runs with this interpreter, the task with this shell's PATH minus ORBIT's own venv
        env = {**attempt_env(bundle, request, attempt), **self.launch_env()}
        uid, python = None, None
        if self.task_user is not None:
            more, uid, python = self.task_user.enter(attempt_dir, env)
            env.update(more)
        started = hostside.launch(
            str(attempt_dir), env, task_environ(), uid, python, secrets=attempt.secrets
        )
        if "error" in started:
            if self.task_user is not None:
                self.task_user.leave(attempt_dir)
            raise LaunchError(FailureReason.LAUNCH_FAILED, str(started["error"]))
        return RunHandle(
            backend_key=self.key,
            target="localhost",
            attempt_id=attempt.attempt_id,
            location=str(attempt_dir),
            data={"pid": started["pid"]},
        )

    def locate(self, request: ExecutionRequest, attempt: AttemptContext) -> RunHandle | None:
        attempt_dir = self.work_dir / attempt.attempt_id
        if not (attempt_dir / "runtime").is_dir():  # made last by copy_frozen: never started
            return None
        return RunHandle(
            backend_key=self.key,
            target="localhost",
            attempt_id=attempt.attempt_id,
            location=str(attempt_dir),
        )

    def status(self, handle: RunHandle) -> RunStatus:
        # the same probe an SSH host runs: it also kills a task its dead wrapper left behind
        found = hostside.probe(handle.location, handle.attempt_id)
        return status_from_files(
            parse_json(found.get("status")),
            parse_json(found.get("result")),
            found.get("alive", False),
        )

    def cancel(self, handle: RunHandle, reason: FailureReason) -> None:
        hostside.cancel(handle.location, reason.value)

    def stop_leftovers(self, handle: RunHandle) -> int:
        return len(host_processes.stop_attempt(handle.location, handle.attempt_id)["stopped"])

    def collect(self, handle: RunHandle, dest: Path) -> CollectResult:
        from orbit.core.execution.artifacts import copy_artifacts

        return copy_artifacts(Path(handle.location) / "artifacts", dest)

    def collect_in_place(self, handle: RunHandle, copy: CopyArtifacts) -> CollectResult:
        return copy(Path(handle.location) / "artifacts", Path("."))
