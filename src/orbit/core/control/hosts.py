"""The hosts part of the control service: SSH hosts registered (checked first, unless asked
not to), listed, checked again (their leftovers swept as at a next contact) and forgotten.
The registry itself, with its probes and sweeps, is core/control/host_registry.py."""

from __future__ import annotations

from orbit.core.control.base import ServicePart
from orbit.core.control.views import HostCheck
from orbit.model.hosts import HostRecord, HostSpec


class Hosts(ServicePart):
    def add_host(self, spec: HostSpec, *, check: bool = True) -> HostRecord:
        return self.hosts.add(spec, check=check)

    def list_hosts(self) -> list[HostRecord]:
        return self.hosts.all()

    def get_host(self, name: str) -> HostRecord:
        return self.hosts.get(name)

    def check_host(self, name: str) -> HostCheck:
        host, swept, stopped = self.hosts.check(name)
        return HostCheck(
            host=host,
            removed_containers=tuple(c.name for c in swept.removed) if swept else (),
            sweep_errors=tuple(swept.errors) if swept else (),
            stopped_processes=dict(stopped.stopped) if stopped else {},
            process_errors=tuple(stopped.errors) if stopped else (),
        )

    def remove_host(self, name: str) -> list[str]:
        """Forget a host; returns the runs still active there (they keep what they need)."""
        active = self.hosts.active_runs(name)
        self.hosts.remove(name)
        return active
