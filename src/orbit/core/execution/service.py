"""The execution service: routes each request to the backend for its key."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from orbit.core.config import Settings
from orbit.core.errors import NoBackend
from orbit.core.execution.backends.base import ExecutionBackend

if TYPE_CHECKING:
    from orbit.core.execution.backends.ssh_host_process import HostDirectory


# Other names a placement kind is known by -> its canonical name. `targon_rental` is what ORBIT's
# original write-up calls a registered SSH rental host; templates written with it run unchanged.
PLACEMENT_ALIASES = {"targon_rental": "ssh"}


def canonical_placement(kind: str) -> str:
    return PLACEMENT_ALIASES.get(kind, kind)


def canonical_key(key: str) -> str:
    """`targon_rental_host_process` -> `ssh_host_process`: an alias's key names the same code."""
    for alias, canonical in PLACEMENT_ALIASES.items():
        if key.startswith(alias + "_"):
            return canonical + key[len(alias) :]
    return key


class ExecutionService:
    def __init__(self, backends: Iterable[ExecutionBackend]) -> None:
        self._backends = {b.key: b for b in backends}

    def keys(self) -> list[str]:
        return sorted(self._backends)

    def backend(self, key: str) -> ExecutionBackend:
        try:
            return self._backends[canonical_key(key)]
        except KeyError:
            known = ", ".join(self.keys())
            raise NoBackend(f"no backend for {key} yet (available: {known})") from None

    @classmethod
    def default(cls, settings: Settings, hosts: HostDirectory | None = None) -> ExecutionService:
        """Every backend this control plane can drive; SSH ones find hosts in `hosts`."""
        from orbit.core.execution.backends.local_docker import LocalDockerBackend
        from orbit.core.execution.backends.local_host_process import LocalHostProcessBackend
        from orbit.core.execution.backends.ssh_host_process import (
            NoHosts,
            SshDockerBackend,
            SshHostProcessBackend,
        )
        from orbit.core.execution.docker.host import plane_id
        from orbit.core.execution.ssh.transport import options_for

        ssh, directory = options_for(settings), hosts or NoHosts()
        return cls(
            [
                LocalHostProcessBackend(settings.work_dir),
                # the same placement, the task in a container
                LocalDockerBackend(settings.work_dir, live=directory.active_attempts),
                SshHostProcessBackend(directory, ssh, plane=plane_id(settings.work_dir)),
                SshDockerBackend(directory, ssh, plane=plane_id(settings.work_dir)),
            ]
        )
