"""The Store: every read and write of ORBIT's durable state, and the one place a state changes.

One class composed of a part per concern (experiments, runs and attempts, users and their
tokens, nodes and their queues, the scheduler's records, the audit trail) over a base that
opens the database and holds the transactions; the hosts registry hangs off it."""

from __future__ import annotations

from orbit.store.audit import AuditMixin
from orbit.store.experiments import ExperimentsMixin
from orbit.store.host_table import HostTable
from orbit.store.runs import RunsMixin
from orbit.store.scheduling import SchedulingMixin
from orbit.store.users import UsersMixin


class Store(ExperimentsMixin, RunsMixin, UsersMixin, SchedulingMixin, AuditMixin):
    """The store at `url`: `sqlite:///path` (the default, in $ORBIT_HOME) or
    `postgresql://...`, migrated to the newest schema when opened. Safe to share between
    threads: each transaction takes a connection of its own."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.hosts = HostTable(self)
