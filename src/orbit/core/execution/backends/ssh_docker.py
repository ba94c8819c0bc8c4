"""`ssh_docker`: a registered SSH host, the task in a container on the host's Docker."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from orbit.core.execution.backends.base import AttemptContext
from orbit.core.execution.backends.ssh_host_process import SshHostProcessBackend
from orbit.core.execution.bundle import FrozenBundle
from orbit.core.execution.docker.host import (
    Runner,
    SweepResult,
    remove_attempt_containers,
    sweep_orphans,
)
from orbit.core.execution.ssh.transport import Ssh
from orbit.model.errors import OrbitError
from orbit.model.hosts import HostRecord
from orbit.model.models import ExecutionRequest, FailureReason, RunHandle, RunStatus


def ssh_runner(ssh: Ssh) -> Runner:
    """Run an argv on the SSH host: (exit code, stdout, stderr), as the Docker sweep wants."""

    def run(argv: list[str]) -> tuple[int, str, str]:
        proc = ssh.run(argv)
        return (
            proc.returncode,
            proc.stdout.decode(errors="replace"),
            proc.stderr.decode(errors="replace"),
        )

    return run


class SshDockerBackend(SshHostProcessBackend):
    """`ssh_docker`: the same placement, the task in a container on the host's Docker (the
    wrapper there calls the bundle's scripts/docker_run.sh). Here: validation against the
    host's last check, the containers of an attempt whose wrapper vanished, and the sweep of
    ORBIT containers on the host that no live attempt owns, at every launch there (the host's
    next contact) and at `orbit hosts check`."""

    key = "ssh_docker"

    def launch(
        self, bundle: FrozenBundle, request: ExecutionRequest, attempt: AttemptContext
    ) -> RunHandle:
        host = self.host(request.target, request.template_id)
        with contextlib.suppress(OrbitError):  # a sweep that fails must not stop a launch
            self.sweep(host, self.hosts.active_attempts())
        return super().launch(bundle, request, attempt)

    def status(self, handle: RunHandle) -> RunStatus:
        found = super().status(handle)
        if found.reason is FailureReason.RUNTIME_LOST:  # nothing else will remove it now
            remove_attempt_containers(ssh_runner(self._ssh(handle)), handle.attempt_id)
        return found

    def sweep(self, host: HostRecord, known_attempt_ids: Iterable[str]) -> SweepResult:
        return sweep_orphans(
            ssh_runner(Ssh(host.spec, self.options)), known_attempt_ids, plane=self.plane
        )
