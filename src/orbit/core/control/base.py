"""What every part of the control service shares: its collaborators (Shared), who is acting,
and the base of a part (ServicePart): those collaborators and the other parts, by name."""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orbit.core.control.keyring import Keyring
from orbit.model.config import OFFLINE_AFTER_S
from orbit.model.errors import InvalidInput, NotFound
from orbit.model.signals import Signal

if TYPE_CHECKING:  # loaded by the commands that use them, not by every command
    from orbit.core.control.host_registry import HostRegistry
    from orbit.core.control.parts import Parts
    from orbit.core.execution.backends.pool_nodes import NodeWakes
    from orbit.core.execution.bundle import FrozenBundle
    from orbit.core.execution.service import ExecutionService
    from orbit.core.tasks import TaskRegistry
    from orbit.model.records import AttemptRecord, ExperimentRecord, RunRecord
    from orbit.model.retention import Retention
    from orbit.model.templates import TemplateRegistry
    from orbit.store import Store


# Who the current call acts for, where that differs from the service's own actor: the server
# sets it per request to the token's user, so every audit event names who really asked.
_acting: ContextVar[str | None] = ContextVar("orbit_acting", default=None)


def current_actor() -> str:
    try:
        return os.environ.get("ORBIT_ACTOR") or getpass.getuser()
    except Exception:  # no passwd entry for this uid (containers)
        return f"uid:{os.getuid()}"


@dataclass(frozen=True)
class ServiceConfig:
    """How one control plane behaves, fixed when it is made (CoreControlService.from_settings
    reads it from Settings and, for a server, its config file)."""

    # Whether reading a run first looks where it runs. Embedded, a look is the only way a run
    # moves; a server's loops look on their own, so its reads answer from the store.
    looks_on_read: bool = True
    node_offline_s: float = OFFLINE_AFTER_S  # Settings.node_offline_s
    lost_retry_floor_s: float = 0.0  # Settings.lost_retry_floor_s: a fenced node's stop first
    scheduler_config_file: Path | None = None  # watched for edits (core/control/sched_config)
    scheduler_config_named: bool = False  # ORBIT_SCHEDULER_CONFIG named it: it must exist
    storage_config_file: Path | None = None  # embedded: storage.yaml, read at each `orbit gc`
    retention: Retention | None = None  # a server's rules (its config's `storage:`) instead
    secret_keys_file: Path | None = None  # Settings.secret_keys_file (core/control/keyring)
    max_sweep_points: int = 10_000  # runs one sweep may make (a server's limits.sweep_points)


class Shared:
    """What every part of the control service works with: the store, the execution plane, the
    registries, the bundle cache, who is acting, the service's config and the signals between
    its parts and the server's loops; all given at construction (CoreControlService)."""

    def __init__(
        self,
        store: Store,
        execution: ExecutionService,
        templates: TemplateRegistry | Callable[[], TemplateRegistry],
        tasks: TaskRegistry | None,
        bundles_dir: Path,
        actor: str,
        config: ServiceConfig,
        wakes: NodeWakes,
        hosts: HostRegistry,
    ) -> None:
        """`templates` may be a function and `tasks` None: each is then made the first time a
        command needs it, not by every command."""
        self.store = store
        self.execution = execution
        self._templates = templates
        self._tasks = tasks
        self.bundles_dir = bundles_dir
        self._actor = actor  # who acts when no call says otherwise: the local user, embedded
        self.config = config
        self.wakes = wakes  # a command was queued for a node (the server's long-polls listen)
        self.pass_wanted: Signal[[]] = Signal()  # a run may be placed now (the scheduler loop)
        self.hosts = hosts
        self.keyring = Keyring(config.secret_keys_file)  # what seals secrets' values

    @property
    def actor(self) -> str:
        return _acting.get() or self._actor

    @property
    def templates(self) -> TemplateRegistry:
        if callable(self._templates):
            self._templates = self._templates()
        return self._templates

    @property
    def tasks(self) -> TaskRegistry:
        """The task plugins; their entry points are looked up when first needed."""
        if self._tasks is None:
            from orbit.core.tasks import TaskRegistry

            self._tasks = TaskRegistry()
        return self._tasks


@contextmanager
def acting_as(name: str) -> Iterator[None]:
    """Within the block (this thread or task), the control service's calls act for `name`."""
    token = _acting.set(name)
    try:
        yield
    finally:
        _acting.reset(token)


def attempt_of(run: RunRecord, number: int | None) -> AttemptRecord:
    """Attempt `number` of the run, or its current one."""
    if number is None:
        return run.current
    for attempt in run.attempts:
        if attempt.number == number:
            return attempt
    raise NotFound(f"run {run.id} has no attempt {number} (it has {len(run.attempts)})")


class ServicePart:
    """One part of the control service (core/control/service.py builds them): the shared
    collaborators, and the other parts it calls, each by name (`self.parts.launching.launch`),
    so a call between parts says where it goes. The parts are all made before any is called."""

    def __init__(self, shared: Shared, parts: Parts) -> None:
        self.shared = shared
        self.parts = parts

    @property
    def store(self) -> Store:
        return self.shared.store

    @property
    def execution(self) -> ExecutionService:
        return self.shared.execution

    @property
    def config(self) -> ServiceConfig:
        return self.shared.config

    @property
    def hosts(self) -> HostRegistry:
        return self.shared.hosts

    @property
    def bundles_dir(self) -> Path:
        return self.shared.bundles_dir

    @property
    def actor(self) -> str:
        return self.shared.actor

    @property
    def templates(self) -> TemplateRegistry:
        return self.shared.templates

    @property
    def tasks(self) -> TaskRegistry:
        return self.shared.tasks

    def fence_wait_s(self, attempt: AttemptRecord) -> float:
        """How long a retry of `attempt`, lost with its node, waits: an agent's node, cut off,
        stops the attempt itself (orbit.agent.fencing) within that time. A Slurm job lost with its
        node has already ended (NODE_FAIL): no wait."""
        return (
            self.config.lost_retry_floor_s if attempt.backend_key.startswith("agent_pool") else 0.0
        )

    def _bundle(self, digest: str) -> FrozenBundle:
        from orbit.core.execution.bundle import FrozenBundle

        path = self.bundles_dir / digest
        if not (path / "job.json").is_file():
            raise NotFound(f"bundle {digest[:12]} is no longer in the cache at {path}")
        return FrozenBundle(digest=digest, path=path)

    def _experiment(self, name_or_id: str) -> ExperimentRecord:
        """Find or create; two submits racing to create the same one both get it."""
        found = self.store.experiments.find_experiment(name_or_id)
        if found is not None:
            return found
        try:
            return self.store.experiments.create_experiment(name_or_id, self.actor)
        except InvalidInput:
            found = self.store.experiments.find_experiment(name_or_id)
            if found is None:
                raise
            return found
