"""The agent's state: what one `orbit agent` knows and holds (its options, identity, the
attempts it tracks, its locks, worker pools and HTTP client). Its parts are modules of
functions over it; orbit.agent.daemon runs them. Imports none of its parts, so that each may
name this type."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from orbit.agent.cleanup import CleanupOptions, WorkDirCleaner
from orbit.agent.service_unit import TOKEN_FILE
from orbit.agent.tracked import Tracked
from orbit.agent.xids import XidWatch
from orbit.wire import protocol as p


@dataclass(frozen=True)
class AgentOptions:
    server: str
    work_dir: Path
    join_token: str | None = None  # read from a file or stdin, never from argv
    join_token_file: Path | None = None  # where it was read: removed after joining if ours
    name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    max_tasks: int = 1
    models: tuple[str, ...] = ()
    datasets: tuple[str, ...] = ()
    services: tuple[tuple[str, str], ...] = ()  # model servers here: (name, URL)
    address: str = ""  # where peers reach this node (a gang's master), else its hostname
    verify: bool | str = True  # TLS: True, False, or a CA bundle's path
    poll_wait_s: float = 25.0
    workers: int = 8
    task_uids: range | None = None  # each attempt's user (as root), else the agent's own
    cleanup: CleanupOptions = field(default_factory=CleanupOptions)  # orbit.agent.cleanup


class AgentState:
    """What the agent knows and holds: its options, identity, attempts, locks, pools and
    connection. Its parts (connection, starting, staging, stopping, sync, transfers, reports)
    are functions over it; orbit.agent.daemon runs them."""

    def __init__(self, options: AgentOptions) -> None:
        # the join token is used once, to join: it is not kept beside the options
        self.join_token = options.join_token
        self.o = dataclasses.replace(options, join_token=None)
        self.work = options.work_dir.absolute()
        self.token_file = self.work / TOKEN_FILE
        self.attempts_dir = self.work / "attempts"
        self.bundles_dir = self.work / "bundles"
        self.session = uuid.uuid4().hex
        self.identity: dict[str, str] = {}
        self.tracked: dict[str, Tracked] = {}
        self.cancelled: set[str] = set()
        self.lock = threading.RLock()
        self.attempt_locks: dict[str, threading.Lock] = {}
        self.bundle_lock = threading.Lock()
        self.acks: list[str] = []
        self.handled: dict[str, float] = {}  # command id -> when (a redelivery is skipped)
        self.heartbeat_s = 5.0
        self.max_tasks = options.max_tasks
        self.stop = threading.Event()
        self.connected = threading.Event()
        self.report_wake = threading.Event()
        self.seq = 0
        self.last_info: p.NodeInfo | None = None
        self.info_at = 0.0
        self.xids = XidWatch(on_fault=self.gpu_fault)
        self.http = httpx.Client(
            base_url=options.server.rstrip("/"),
            verify=options.verify,
            timeout=httpx.Timeout(30.0, read=options.poll_wait_s + 15.0),
            headers={
                p.VERSION_HEADER: str(p.PROTOCOL_VERSION),
                "content-type": "application/json",
            },
            limits=httpx.Limits(max_connections=options.workers + 8),
        )
        self.workers = ThreadPoolExecutor(options.workers, thread_name_prefix="agent-work")
        self.urgent = ThreadPoolExecutor(2, thread_name_prefix="agent-cancel")
        self.plane = ""
        from orbit.agent.isolation import TaskUsers

        self.users = TaskUsers(options.task_uids) if options.task_uids else None
        from orbit.agent.fencing import Fence

        self.fence = Fence(self.attempts_dir)
        self.missing: set[str] = set()  # asked for, no folder here: said in the next report
        self.revoked = False
        self.released_at = 0.0  # when ended attempts last gave back their users
        self.cleaner = WorkDirCleaner(self, options.cleanup)

    @property
    def node_id(self) -> str:
        return self.identity["node_id"]

    def gpu_fault(self) -> None:
        self.info_at = float("-inf")  # the next heartbeat carries the node's facts, fault included

    def node_info(self) -> p.NodeInfo:
        from orbit.agent.nodeinfo import collect

        faults = self.xids.faults()
        return collect(
            self.work,
            models=self.o.models,
            datasets=self.o.datasets,
            faults=faults,
            services=dict(self.o.services),
            address=self.o.address,
        )

    def gpu_utilization(self) -> dict[int, float]:
        """Each GPU's utilization now, for the heartbeat; no NVML call where the node's last
        facts named no GPU."""
        if self.last_info is None or not self.last_info.accelerators:
            return {}
        from orbit.agent.nodeinfo import utilization

        return utilization()

    def attempt_lock(self, attempt_id: str) -> threading.Lock:
        with self.lock:
            return self.attempt_locks.setdefault(attempt_id, threading.Lock())
