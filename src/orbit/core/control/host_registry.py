"""The hosts part of the control service: register SSH hosts, check them, forget them."""

from __future__ import annotations

from collections.abc import Callable

from orbit.core.execution.docker.host import SweepResult
from orbit.core.execution.ssh.transport import SshOptions, probe_host
from orbit.core.hosts import HostFacts, HostRecord, HostSpec
from orbit.core.models import RunState
from orbit.store import Store
from orbit.store.host_table import already_exists

Prober = Callable[[HostSpec, SshOptions], HostFacts]
# stops and removes the ORBIT containers on a host that none of the given attempts owns
Sweeper = Callable[[HostRecord, set[str]], SweepResult]


class HostRegistry:
    def __init__(
        self,
        store: Store,
        options: SshOptions,
        actor: str,
        probe: Prober = probe_host,
        sweep: Sweeper | None = None,
    ) -> None:
        self.store = store
        self.options = options
        self.actor = actor
        self.probe = probe
        self.sweep = sweep

    def add(self, spec: HostSpec, *, check: bool = True) -> HostRecord:
        """Record a host. With `check` (the default) it is probed first, and a host that
        cannot be reached, refuses the key or has an unknown host key is not recorded."""
        if self.store.hosts.find(spec.name) is not None:  # before a probe that may be slow
            raise already_exists(spec.name)
        facts = self.probe(spec, self.options) if check else None
        return self.store.hosts.add(spec, facts, self.actor)

    def check(self, name: str) -> tuple[HostRecord, SweepResult | None]:
        """Probe the host again and record what it has now. Where it has docker, ORBIT's
        containers there that no live attempt owns are stopped and removed."""
        host = self.store.hosts.get(name)
        facts = self.probe(host.spec, self.options)
        host = self.store.hosts.set_facts(name, facts, self.actor)
        swept = None
        if facts.docker and facts.docker != "client only" and self.sweep is not None:
            swept = self.sweep(host, self.store.hosts.active_attempts())
            if swept.removed:
                self.store.record_event(
                    self.actor,
                    "host.swept",
                    host=name,
                    containers=[c.name for c in swept.removed],
                    attempts=sorted({c.attempt_id for c in swept.removed}),
                )
        return host, swept

    def get(self, name: str) -> HostRecord:
        return self.store.hosts.get(name)

    def all(self) -> list[HostRecord]:
        return self.store.hosts.all()

    def active_runs(self, name: str) -> list[str]:
        """Runs whose current attempt is on this host and has not ended."""
        active = self.store.list_runs(states={s for s in RunState if not s.terminal})
        return [r.id for r in active if r.current.target == name]

    def remove(self, name: str) -> None:
        """Forget a host. Its runs keep what they need to be found (their handles hold the
        host's SSH settings), so removing a host never loses a run."""
        self.store.hosts.remove(name, self.actor)
