"""`orbit agent`: the daemon on an in-house GPU server. It only ever connects out.

Threads, each with its own job, so that a slow one never holds up another:
- the poll loop keeps a long-poll open and hands each command to a worker pool (a cancel has
  its own small pool: a slow upload or bundle fetch never delays it);
- the heartbeat loop says the node lives, with its node info when that changed;
- the reporter uploads its attempts' files by byte offset, logs and small files first.

Attempts run with the local backends (orbit.core.execution.backends.local_*), as a local run
does, each in `<work dir>/attempts/<attempt id>/`. An attempt starts only after the server
grants its start (the fencing check), and never twice on this node: a start for an attempt
whose folder exists here is not started again. On every (re)connect the agent tells the server
what it runs and stops what the server does not know, by ORBIT's marks only (processes carrying
the attempt's ORBIT_ATTEMPT_ID and this agent's ORBIT_PLANE; containers by their labels).

Its parts, each a module of functions over this Agent's state: connection (joining, posting,
answers), starting, staging (bundles, checkpoints), stopping, sync (resync, heartbeat, the
fence), transfers (collect, push, pull) and reports. This module holds the state and the
poll loop that hands each command to its part."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from orbit.agent import connection, reports, starting, stopping, sync, transfers
from orbit.agent.cleanup import CleanupOptions, WorkDirCleaner
from orbit.agent.connection import RETRY_MAX_S, RETRY_MIN_S, read_join_token
from orbit.agent.tracked import Tracked
from orbit.agent.xids import XidWatch
from orbit.wire import protocol as p

__all__ = ["Agent", "AgentOptions", "read_join_token"]

log = logging.getLogger("orbit.agent")


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


class Agent:
    def __init__(self, options: AgentOptions) -> None:
        # the join token is used once, to join: it is not kept beside the options
        self.join_token = options.join_token
        self.o = dataclasses.replace(options, join_token=None)
        self.work = options.work_dir.absolute()
        self.token_file = self.work / connection.TOKEN_FILE
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
        self.xids = XidWatch(on_fault=self._gpu_fault)
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

    def _gpu_fault(self) -> None:
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

    def run(self) -> int:
        """Until stopped (SIGTERM) or revoked; returns the exit code."""
        os.umask(0o077)  # what the agent writes is its own (what a task gets is handed over)
        try:
            connection.load_or_register(self)
        except connection.Revoked as exc:
            log.error("the server refused to register this node: %s", exc)
            return 3
        except connection.ServerSaid as exc:
            log.error("the server refused to register this node: %s", exc.detail)
            return 3
        self._isolate()
        sync.restore(self)
        self.xids.start()
        threads = [
            threading.Thread(target=self._guard(sync.heartbeat_loop), name="agent-heartbeat"),
            threading.Thread(target=self._guard(reports.report_loop), name="agent-report"),
            threading.Thread(target=self.cleaner.loop, name="agent-cleanup"),
        ]
        for thread in threads:
            thread.daemon = True
            thread.start()
        code = 0
        try:
            self.poll_loop()
        except connection.Revoked as exc:
            log.error("this node is locked out (%s): stopping. Join again with a new token", exc)
            self.revoked = True
        finally:
            if self.revoked:  # its attempts are the server's to give up (lost): none goes on
                code = 3
                for attempt_id in sync.running_ids(self):
                    stopping.halt(self, attempt_id, "this node was revoked")
            self.stop.set()
            self.xids.stop.set()
            self.report_wake.set()
            self.workers.shutdown(wait=False, cancel_futures=True)
            self.urgent.shutdown(wait=False, cancel_futures=True)
        return code

    def _isolate(self) -> None:
        """Say (and check) who this node's tasks run as."""
        if self.users is None:
            who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
            log.warning(
                "tasks run as this agent's own user (%s): they can read its credential and "
                "each other's files. On a shared node run the agent as root (each task then "
                "gets a user of its own: --task-uids)",
                who,
            )
            return
        self.users.check(self.attempts_dir)
        uids = self.users.uids
        log.info(
            "tasks run as users of their own (uids %d-%d), their wrapper with %s",
            uids.start,
            uids.stop - 1,
            self.users.python,
        )

    def _guard(self, loop: Callable[[Agent], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                loop(self)
            except connection.Revoked as exc:
                log.error("this node is locked out (%s): stopping", exc)
                self.revoked = True
                self.stop.set()

        return run

    def poll_loop(self) -> None:
        backoff = RETRY_MIN_S
        while not self.stop.is_set():
            try:
                if not self.connected.is_set():
                    sync.resync(self)
                    self.connected.set()
                    backoff = RETRY_MIN_S
                    log.info("connected to %s as %s", self.o.server, self.identity["name"])
                self.poll_once()
            except (httpx.HTTPError, connection.ServerSaid) as exc:
                if self.connected.is_set():
                    log.warning("lost the server (%s): reconnecting", connection.short(exc))
                self.connected.clear()
                self.stop.wait(backoff)
                backoff = min(backoff * 2, RETRY_MAX_S)

    def poll_once(self) -> None:
        with self.lock:
            acks, self.acks = self.acks, []
        body = p.PollRequest(
            node_id=self.node_id, session=self.session, acks=tuple(acks), wait_s=self.o.poll_wait_s
        )
        try:
            answer: p.PollResponse = connection.post(self, "/poll", body, p.PollResponse)
        except BaseException:
            with self.lock:
                self.acks = acks + self.acks  # not acknowledged: say so again next time
            raise
        if answer.resync:
            log.warning("the server did not expect an acknowledgement: resyncing from scratch")
            with self.lock:
                self.acks = []
                self.handled.clear()
            self.connected.clear()
            return
        for command in answer.commands:
            with self.lock:
                self.acks.append(command.id)
                if command.id in self.handled:
                    continue
                self.handled[command.id] = time.monotonic()
            pool = self.urgent if isinstance(command.body, p.CancelAttempt) else self.workers
            pool.submit(self._handle, command)
        self._forget_old_commands()

    def _forget_old_commands(self) -> None:
        cutoff = time.monotonic() - 3600
        with self.lock:
            for cid in [c for c, at in self.handled.items() if at < cutoff]:
                del self.handled[cid]

    def _handle(self, command: p.Command) -> None:
        body = command.body
        try:
            if isinstance(body, p.StartAttempt):
                starting.start(self, body)
            elif isinstance(body, p.CancelAttempt):
                stopping.cancel(self, body)
            elif isinstance(body, p.UploadFiles):
                transfers.upload_everything(self, body.attempt_id)
            elif isinstance(body, p.PutFile):
                transfers.put_file(self, body)
            elif isinstance(body, p.GetFile):
                transfers.get_file(self, body)
            elif isinstance(body, p.Resync):
                self.connected.clear()
            elif isinstance(body, p.RemoveAttempts):
                self.cleaner.remove(body.attempt_ids)
        except connection.Revoked:
            self.stop.set()
        except Exception:
            log.exception("command %s (%s) failed", command.id, body.kind)

    def _attempt_lock(self, attempt_id: str) -> threading.Lock:
        with self.lock:
            return self.attempt_locks.setdefault(attempt_id, threading.Lock())
