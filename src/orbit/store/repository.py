"""The Store: every read and write of ORBIT's durable state, one part per concern.

Each part is a class of its own module, built here over the one database and reachable by
name (`store.runs.get_run(...)`, `store.nodes.list_nodes()`), so a reader finds a method in the
module its part names. How a run's state changes is one part: `store.attempts`
(orbit.store.attempt_states)."""

from __future__ import annotations

from orbit.store.alerts import Alerts
from orbit.store.attempt_leases import AttemptLeases
from orbit.store.attempt_states import AttemptStates
from orbit.store.audit import AuditTrail
from orbit.store.base import open_database
from orbit.store.dependencies import Dependencies
from orbit.store.experiments import Experiments
from orbit.store.groups import Groups
from orbit.store.host_table import HostTable
from orbit.store.node_commands import NodeCommands
from orbit.store.node_heartbeats import NodeHeartbeats
from orbit.store.nodes import Nodes
from orbit.store.placement import Placements
from orbit.store.policies import Policies
from orbit.store.runs import Runs
from orbit.store.sched_config_table import SchedConfigTable
from orbit.store.scheduling import SchedulerRows
from orbit.store.secrets import Secrets
from orbit.store.storage import StorageTable
from orbit.store.submit_keys import SubmitKeys
from orbit.store.users import Users
from orbit.store.wait_reads import WaitReads


class Store:
    """The store at `url`: `sqlite:///path` (the default, in $ORBIT_HOME) or
    `postgresql://...`, migrated to the newest schema when opened. Safe to share between
    threads: each transaction takes a connection of its own."""

    def __init__(
        self, url: str, audit_key: bytes | None = None, pool_size: int | None = None
    ) -> None:
        """`audit_key`: key the audit chain with it (orbit.model.audit_chain); a store whose
        chain is keyed under another key is refused here, before anything is written.
        `pool_size`: on PostgreSQL, hold at most this many connections (orbit.store.sql)."""
        self.url = url
        self.db = db = open_database(url, audit_key, pool_size)
        self.experiments = Experiments(db)
        self.runs = Runs(db)  # runs and their attempts, written and read
        self.groups = Groups(db)  # the runs a sweep made together
        self.attempts = AttemptStates(db)  # an attempt's state moves: the one place
        self.leases = AttemptLeases(db)  # who launches or reconciles an attempt
        self.dependencies = Dependencies(db)  # `after:` and the launches it holds back
        self.submit_keys = SubmitKeys(db)
        self.users = Users(db)  # users and their tokens
        self.audit = AuditTrail(db)
        self.nodes = Nodes(db)  # join tokens and agent nodes
        self.heartbeats = NodeHeartbeats(db)
        self.commands = NodeCommands(db)  # each node's queue of commands
        self.placement = Placements(db)  # attempts placed on nodes' GPUs
        self.scheduling = SchedulerRows(db)  # a pass's reads and records, quotas
        self.sched_config = SchedConfigTable(db)
        self.waits = WaitReads(db)
        self.hosts = HostTable(db)
        self.storage = StorageTable(db)
        self.secrets = Secrets(db)  # values sealed under the server's keys, never shown
        self.policies = Policies(db)  # applied policy files, the newest in force
        self.alerts = Alerts(db)  # conditions that need a person, raised and resolved

    @property
    def dialect(self) -> str:
        """`sqlite` or `postgresql`."""
        return self.db.dialect

    def close(self) -> None:
        self.db.close()
