"""The execution service: routes each request to the backend for its key."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from orbit.core.execution.backends.base import ExecutionBackend
from orbit.model.config import Settings
from orbit.model.errors import NoBackend

if TYPE_CHECKING:
    from orbit.core.execution.backends.pool_nodes import NodeDirectory, NodeWakes
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
    """Backends by key. A backend given as a factory is made the first time it is asked for,
    so a command that only reads local runs never loads the SSH or Docker code."""

    def __init__(
        self,
        backends: Iterable[ExecutionBackend] = (),
        factories: Mapping[str, Callable[[], ExecutionBackend]] | None = None,
    ) -> None:
        self._backends = {b.key: b for b in backends}
        self._factories = dict(factories or {})

    def keys(self) -> list[str]:
        return sorted({*self._backends, *self._factories})

    def backend(self, key: str) -> ExecutionBackend:
        key = canonical_key(key)
        found = self._backends.get(key)
        if found is None:
            factory = self._factories.get(key)
            if factory is None:
                known = ", ".join(self.keys())
                raise NoBackend(f"no backend for {key} yet (available: {known})")
            found = self._backends[key] = factory()
        return found

    @classmethod
    def default(
        cls,
        settings: Settings,
        hosts: HostDirectory | None = None,
        nodes: NodeDirectory | None = None,
        wakes: NodeWakes | None = None,
    ) -> ExecutionService:
        """Every backend this control plane can drive; SSH ones find hosts in `hosts`, agent
        pool ones nodes in `nodes`, telling `wakes` when they queue a command for one."""

        def local_host_process() -> ExecutionBackend:
            from orbit.core.execution.backends.local_host_process import LocalHostProcessBackend

            return LocalHostProcessBackend(settings.work_dir)

        def local_docker() -> ExecutionBackend:  # the same placement, the task in a container
            from orbit.core.execution.backends.local_docker import LocalDockerBackend

            return LocalDockerBackend(settings.work_dir, live=directory().active_attempts)

        def ssh_host_process() -> ExecutionBackend:
            from orbit.core.execution.backends.ssh_host_process import SshHostProcessBackend
            from orbit.core.execution.docker.host import plane_id
            from orbit.core.execution.ssh.transport import options_for

            return SshHostProcessBackend(
                directory(), options_for(settings), plane=plane_id(settings.work_dir)
            )

        def ssh_docker() -> ExecutionBackend:
            from orbit.core.execution.backends.ssh_docker import SshDockerBackend
            from orbit.core.execution.docker.host import plane_id
            from orbit.core.execution.ssh.transport import options_for

            return SshDockerBackend(
                directory(), options_for(settings), plane=plane_id(settings.work_dir)
            )

        def slurm_host_process() -> ExecutionBackend:
            from orbit.core.execution.backends.slurm_host_process import SlurmHostProcessBackend
            from orbit.core.execution.docker.host import plane_id
            from orbit.core.execution.ssh.transport import options_for
            from orbit.store.cluster_table import ClusterTable

            db = getattr(hosts, "db", None)  # the clusters share the hosts' table
            if db is None:
                raise NoBackend("Slurm clusters need the control plane's store")
            return SlurmHostProcessBackend(
                ClusterTable(db), options_for(settings), plane=plane_id(settings.work_dir)
            )

        def slurm_docker() -> ExecutionBackend:  # the same placement, the task in a container
            from orbit.core.execution.backends.slurm_docker import SlurmDockerBackend
            from orbit.core.execution.docker.host import plane_id
            from orbit.core.execution.ssh.transport import options_for
            from orbit.store.cluster_table import ClusterTable

            db = getattr(hosts, "db", None)
            if db is None:
                raise NoBackend("Slurm clusters need the control plane's store")
            return SlurmDockerBackend(
                ClusterTable(db), options_for(settings), plane=plane_id(settings.work_dir)
            )

        def agent_pool(launch_mode: str) -> Callable[[], ExecutionBackend]:
            def make() -> ExecutionBackend:
                from orbit.core.execution.backends.agent_pool import AgentPoolBackend

                if nodes is None:
                    raise NoBackend("agent pools need the control plane's store")
                return AgentPoolBackend(
                    launch_mode,
                    nodes,
                    settings.artifacts_dir,
                    offline_after_s=settings.node_offline_s,
                    lost_grace_s=settings.node_lost_grace_s,
                    wakes=wakes,
                )

            return make

        def directory() -> HostDirectory:
            from orbit.core.execution.backends.ssh_host_process import NoHosts

            return hosts or NoHosts()

        return cls(
            factories={
                "local_host_process": local_host_process,
                "local_docker": local_docker,
                "ssh_host_process": ssh_host_process,
                "ssh_docker": ssh_docker,
                "slurm_host_process": slurm_host_process,
                "slurm_docker": slurm_docker,
                "agent_pool_host_process": agent_pool("host_process"),
                "agent_pool_docker": agent_pool("docker"),
            }
        )
