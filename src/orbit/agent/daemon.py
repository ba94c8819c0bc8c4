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

Its parts, each a module of functions over the agent's state (orbit.agent.state): connection
(joining, posting, answers), starting, staging (bundles, checkpoints), stopping, sync (resync,
heartbeat, the fence), transfers (collect, push, pull) and reports. This module runs them: the
threads, and the poll loop that hands each command to its part."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

import httpx

from orbit.agent import connection, reports, starting, stopping, sync, transfers
from orbit.agent.connection import read_join_token
from orbit.agent.state import AgentOptions, AgentState
from orbit.wire import protocol as p

__all__ = ["Agent", "AgentOptions", "read_join_token"]

log = logging.getLogger("orbit.agent")


class Agent:
    """The daemon: its state (orbit.agent.state), and the loops that hand that state to its
    parts."""

    def __init__(self, options: AgentOptions) -> None:
        self.state = AgentState(options)

    def shutdown(self) -> None:
        """Ask run() to end (a signal handler: it only sets an event)."""
        self.state.stop.set()

    def run(self) -> int:
        """Until stopped (SIGTERM) or revoked; returns the exit code."""
        agent = self.state
        os.umask(0o077)  # what the agent writes is its own (what a task gets is handed over)
        try:
            connection.load_or_register(agent)
        except connection.Revoked as exc:
            log.error("the server refused to register this node: %s", exc)
            return 3
        except connection.ServerSaid as exc:
            log.error("the server refused to register this node: %s", exc.detail)
            return 3
        self._isolate()
        sync.restore(agent)
        agent.xids.start()
        threads = [
            threading.Thread(target=self._guard(sync.heartbeat_loop), name="agent-heartbeat"),
            threading.Thread(target=self._guard(reports.report_loop), name="agent-report"),
            threading.Thread(target=agent.cleaner.loop, name="agent-cleanup"),
        ]
        for thread in threads:
            thread.daemon = True
            thread.start()
        code = 0
        try:
            self.poll_loop()
        except connection.Revoked as exc:
            log.error("this node is locked out (%s): stopping. Join again with a new token", exc)
            agent.revoked = True
        finally:
            if agent.revoked:  # its attempts are the server's to give up (lost): none goes on
                code = 3
                for attempt_id in sync.running_ids(agent):
                    stopping.halt(agent, attempt_id, "this node was revoked")
            agent.stop.set()
            agent.xids.stop.set()
            agent.report_wake.set()
            agent.workers.shutdown(wait=False, cancel_futures=True)
            agent.urgent.shutdown(wait=False, cancel_futures=True)
        return code

    def _isolate(self) -> None:
        """Say (and check) who this node's tasks run as."""
        agent = self.state
        if agent.users is None:
            who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
            log.warning(
                "tasks run as this agent's own user (%s): they can read its credential and "
                "each other's files. On a shared node run the agent as root (each task then "
                "gets a user of its own: --task-uids)",
                who,
            )
            return
        agent.users.check(agent.attempts_dir)
        uids = agent.users.uids
        log.info(
            "tasks run as users of their own (uids %d-%d), their wrapper with %s",
            uids.start,
            uids.stop - 1,
            agent.users.python,
        )

    def _guard(self, loop: Callable[[AgentState], None]) -> Callable[[], None]:
        agent = self.state

        def run() -> None:
            try:
                loop(agent)
            except connection.Revoked as exc:
                log.error("this node is locked out (%s): stopping", exc)
                agent.revoked = True
                agent.stop.set()

        return run

    def poll_loop(self) -> None:
        agent = self.state
        # jittered: every agent lost a restarting server in the same instant, and must not
        # all come back in the same instant too
        waits = connection.backoff()
        while not agent.stop.is_set():
            try:
                if not agent.connected.is_set():
                    sync.resync(agent)
                    agent.connected.set()
                    waits.reset()
                    log.info("connected to %s as %s", agent.o.server, agent.identity["name"])
                self.poll_once()
            except (httpx.HTTPError, connection.ServerSaid) as exc:
                if agent.connected.is_set():
                    log.warning("lost the server (%s): reconnecting", connection.short(exc))
                agent.connected.clear()
                agent.stop.wait(waits.next(connection.asked(exc)))

    def poll_once(self) -> None:
        agent = self.state
        with agent.lock:
            acks, agent.acks = agent.acks, []
        body = p.PollRequest(
            node_id=agent.node_id,
            session=agent.session,
            acks=tuple(acks),
            wait_s=agent.o.poll_wait_s,
        )
        try:
            answer: p.PollResponse = connection.post(agent, "/poll", body, p.PollResponse)
        except BaseException:
            with agent.lock:
                agent.acks = acks + agent.acks  # not acknowledged: say so again next time
            raise
        if answer.resync:
            log.warning("the server did not expect an acknowledgement: resyncing from scratch")
            with agent.lock:
                agent.acks = []
                agent.handled.clear()
            agent.connected.clear()
            return
        for command in answer.commands:
            with agent.lock:
                agent.acks.append(command.id)
                if command.id in agent.handled:
                    continue
                agent.handled[command.id] = time.monotonic()
            pool = agent.urgent if isinstance(command.body, p.CancelAttempt) else agent.workers
            pool.submit(self._handle, command)
        self._forget_old_commands()

    def _forget_old_commands(self) -> None:
        agent = self.state
        cutoff = time.monotonic() - 3600
        with agent.lock:
            for cid in [c for c, at in agent.handled.items() if at < cutoff]:
                del agent.handled[cid]

    def _handle(self, command: p.Command) -> None:
        agent = self.state
        body = command.body
        try:
            if isinstance(body, p.StartAttempt):
                starting.start(agent, body)
            elif isinstance(body, p.CancelAttempt):
                stopping.cancel(agent, body)
            elif isinstance(body, p.UploadFiles):
                transfers.upload_everything(agent, body.attempt_id)
            elif isinstance(body, p.PutFile):
                transfers.put_file(agent, body)
            elif isinstance(body, p.GetFile):
                transfers.get_file(agent, body)
            elif isinstance(body, p.Resync):
                agent.connected.clear()
            elif isinstance(body, p.RemoveAttempts):
                agent.cleaner.remove(body.attempt_ids)
        except connection.Revoked:
            agent.stop.set()
        except Exception:
            log.exception("command %s (%s) failed", command.id, body.kind)
