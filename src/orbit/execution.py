"""The execution service: routes each request to the backend for its key."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from orbit.backends.base import ExecutionBackend
from orbit.config import Settings
from orbit.errors import NoBackend

if TYPE_CHECKING:
    from orbit.backends.ssh_host_process import HostDirectory


class ExecutionService:
    def __init__(self, backends: Iterable[ExecutionBackend]) -> None:
        self._backends = {b.key: b for b in backends}

    def keys(self) -> list[str]:
        return sorted(self._backends)

    def backend(self, key: str) -> ExecutionBackend:
        try:
            return self._backends[key]
        except KeyError:
            known = ", ".join(self.keys())
            raise NoBackend(f"no backend for {key} yet (available: {known})") from None

    @classmethod
    def default(cls, settings: Settings, hosts: HostDirectory | None = None) -> ExecutionService:
        """Every backend this control plane can drive; SSH ones find hosts in `hosts`."""
        from orbit.backends.local_docker import LocalDockerBackend
        from orbit.backends.local_host_process import LocalHostProcessBackend
        from orbit.backends.ssh_host_process import NoHosts, SshDockerBackend, SshHostProcessBackend
        from orbit.docker_host import plane_id
        from orbit.ssh import options_for

        ssh, directory = options_for(settings), hosts or NoHosts()
        return cls(
            [
                LocalHostProcessBackend(settings.work_dir),
                # the same placement, the task in a container
                LocalDockerBackend(settings.work_dir, live=directory.active_attempts),
                SshHostProcessBackend(directory, ssh),
                SshDockerBackend(directory, ssh, plane=plane_id(settings.work_dir)),
            ]
        )
