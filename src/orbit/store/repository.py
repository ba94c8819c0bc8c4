"""The Store: every read and write of ORBIT's durable state, and the one place a state changes.

One class composed of a part per concern (experiments, runs and attempts, users and their
tokens, nodes and their queues, the scheduler's records, the audit trail, submit keys) over a
base that opens the database and holds the transactions; the hosts registry and storage (a
run's marks, removals, measured sizes: orbit.store.storage) hang off it."""

from __future__ import annotations

from orbit.store.attempt_leases import AttemptLeasesMixin
from orbit.store.attempt_states import AttemptStatesMixin
from orbit.store.audit import AuditMixin
from orbit.store.dependencies import DependenciesMixin
from orbit.store.experiments import ExperimentsMixin
from orbit.store.host_table import HostTable
from orbit.store.node_commands import NodeCommandsMixin
from orbit.store.node_heartbeats import NodeHeartbeatsMixin
from orbit.store.placement import PlacementMixin
from orbit.store.run_selection import RunSelectionMixin
from orbit.store.runs import RunsMixin
from orbit.store.sched_config_table import SchedConfigTable
from orbit.store.scheduling import SchedulingMixin
from orbit.store.storage import StorageTable
from orbit.store.submit_keys import SubmitKeysMixin
from orbit.store.users import UsersMixin
from orbit.store.wait_reads import WaitReads


class Store(
    ExperimentsMixin,
    RunsMixin,
    AttemptStatesMixin,
    AttemptLeasesMixin,
    UsersMixin,
    SchedulingMixin,
    AuditMixin,
    SubmitKeysMixin,
    DependenciesMixin,
    RunSelectionMixin,
    NodeHeartbeatsMixin,
    NodeCommandsMixin,
    PlacementMixin,
):
    """The store at `url`: `sqlite:///path` (the default, in $ORBIT_HOME) or
    `postgresql://...`, migrated to the newest schema when opened. Safe to share between
    threads: each transaction takes a connection of its own."""

    def __init__(self, url: str, audit_key: bytes | None = None) -> None:
        super().__init__(url, audit_key)
        self.hosts = HostTable(self)
        self.sched_config = SchedConfigTable(self)
        self.waits = WaitReads(self)
        self.storage = StorageTable(self)
