"""`local_docker`: the attempt runs on this machine, its task inside a container.

The placement is the local one, unchanged: the wrapper runs detached on this machine and
reads and writes the attempt's folder as for a host process. What differs lives in the bundle
(scripts/docker_run.sh and friends, which the wrapper calls), so this backend adds only what
the control plane must decide or clean up on its side: refusing what the Docker host cannot
run before anything is written, removing the containers of an attempt whose wrapper vanished,
and sweeping ORBIT containers that no live attempt owns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from orbit.core.execution.backends.base import AttemptContext
from orbit.core.execution.backends.local_host_process import LocalHostProcessBackend
from orbit.core.execution.bundle import FrozenBundle
from orbit.core.execution.docker.host import (
    Runner,
    SweepResult,
    check_docker_request,
    docker_endpoint,
    docker_facts,
    docker_is_local,
    local_runner,
    plane_id,
    remove_attempt_containers,
    sweep_orphans,
)
from orbit.model.models import ExecutionRequest, FailureReason, RunHandle, RunStatus


class LocalDockerBackend(LocalHostProcessBackend):
    key = "local_docker"

    def __init__(
        self,
        work_dir: Path,
        run: Runner = local_runner,
        live: Callable[[], set[str]] | None = None,
    ) -> None:
        super().__init__(work_dir)
        self.run = run
        self.plane = plane_id(work_dir)
        self.live = live  # the attempts of this control plane that have not ended

    def launch(
        self, bundle: FrozenBundle, request: ExecutionRequest, attempt: AttemptContext
    ) -> RunHandle:
        """Before each launch (this machine's "next contact"), sweep the containers no live
        attempt owns; a sweep that fails never stops the launch."""
        if self.live is not None:
            self.sweep(self.live())
        return super().launch(bundle, request, attempt)

    def validate(self, request: ExecutionRequest) -> None:
        self.check_target(request)  # this machine only
        check_docker_request(request, docker_facts(self.run), docker_endpoint())
        if docker_is_local():  # a Docker host elsewhere has GPUs of its own, not this machine's
            self.check_gpus(request)

    def launch_env(self) -> dict[str, str]:
        return {"ORBIT_PLANE": self.plane}

    def status(self, handle: RunHandle) -> RunStatus:
        found = super().status(handle)
        if found.reason is FailureReason.RUNTIME_LOST:
            # its wrapper is gone, so nothing else will remove its container
            remove_attempt_containers(self.run, handle.attempt_id)
        return found

    def sweep(self, known_attempt_ids: Iterable[str]) -> SweepResult:
        """Stop and remove this control plane's containers whose attempt is not among the
        live ones it knows (before every launch here); nothing else on the Docker host is
        touched."""
        return sweep_orphans(self.run, known_attempt_ids, plane=self.plane)
