"""The hosts part of the control service: register SSH hosts, check them, forget them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from orbit.model.hosts import HostFacts, HostRecord, HostSpec
from orbit.model.models import RunState
from orbit.store.host_table import already_exists

if TYPE_CHECKING:  # the SSH and Docker code loads when a host is first probed or swept
    from orbit.core.execution.backends.base import ProcessSweep
    from orbit.core.execution.docker.host import SweepResult
    from orbit.core.execution.ssh.transport import SshOptions
    from orbit.store import Store

    Prober = Callable[[HostSpec, SshOptions], HostFacts]
    # stops and removes the ORBIT containers on a host that none of the given attempts owns
    Sweeper = Callable[[HostRecord, set[str]], SweepResult]
    # stops the processes on a host of this control plane's attempts that none of the given owns
    ProcessSweeper = Callable[[HostRecord, set[str]], ProcessSweep]


class HostRegistry:
    def __init__(
        self,
        store: Store,
        options: SshOptions | Callable[[], SshOptions],
        actor: Callable[[], str],
        probe: Prober | None = None,
        sweep: Sweeper | None = None,
        sweep_processes: ProcessSweeper | None = None,
    ) -> None:
        """`options` may be given as a function: the SSH code loads when a host is first
        probed, not for every command."""
        self.store = store
        self._options = options
        self._actor = actor  # asked on each call: the server acts for each request's user
        self._probe = probe
        self.sweep = sweep
        self.sweep_processes = sweep_processes

    @property
    def actor(self) -> str:
        return self._actor()

    @property
    def options(self) -> SshOptions:
        if callable(self._options):
            self._options = self._options()
        return self._options

    def probe(self, spec: HostSpec, options: SshOptions) -> HostFacts:
        if self._probe is None:
            from orbit.core.execution.ssh.transport import probe_host

            self._probe = probe_host
        return self._probe(spec, options)

    def add(self, spec: HostSpec, *, check: bool = True) -> HostRecord:
        """Record a host. With `check` (the default) it is probed first, and a host that
        cannot be reached, refuses the key or has an unknown host key is not recorded."""
        if self.store.hosts.find(spec.name) is not None:  # before a probe that may be slow
            raise already_exists(spec.name)
        facts = self.probe(spec, self.options) if check else None
        return self.store.hosts.add(spec, facts, self.actor)

    def check(self, name: str) -> tuple[HostRecord, SweepResult | None, ProcessSweep | None]:
        """Probe the host again and record what it has now. The processes there of this
        control plane's attempts that have ended are stopped; where it has docker, ORBIT's
        containers there that no live attempt owns are stopped and removed."""
        host = self.store.hosts.get(name)
        facts = self.probe(host.spec, self.options)
        host = self.store.hosts.set_facts(name, facts, self.actor)
        live = self.store.hosts.active_attempts()
        stopped = None
        if self.sweep_processes is not None:
            stopped = self.sweep_processes(host, live)
            self.record_stopped(name, stopped)
        swept = None
        if facts.docker and facts.docker != "client only" and self.sweep is not None:
            swept = self.sweep(host, live)
            if swept.removed:
                self.store.audit.record_event(
                    self.actor,
                    "host.swept",
                    host=name,
                    containers=[c.name for c in swept.removed],
                    attempts=sorted({c.attempt_id for c in swept.removed}),
                )
        return host, swept, stopped

    def record_stopped(self, name: str, stopped: ProcessSweep, actor: str | None = None) -> None:
        if stopped.count:
            self.store.audit.record_event(
                actor or self.actor,
                "host.processes_stopped",
                host=name,
                attempts=sorted(stopped.stopped),
                processes=stopped.count,
            )

    def get(self, name: str) -> HostRecord:
        return self.store.hosts.get(name)

    def all(self) -> list[HostRecord]:
        return self.store.hosts.all()

    def active_runs(self, name: str) -> list[str]:
        """Runs whose current attempt is on this host and has not ended."""
        active = self.store.runs.list_runs(states={s for s in RunState if not s.terminal})
        return [r.id for r in active if r.current.target == name]

    def remove(self, name: str) -> None:
        """Forget a host. Its runs keep what they need to be found (their handles hold the
        host's SSH settings), so removing a host never loses a run."""
        self.store.hosts.remove(name, self.actor)
