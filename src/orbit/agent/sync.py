"""Keeping in touch: the sync on every (re)connect (what runs here, what the server wants
stopped, halted or forgotten), the markers restored after a restart, and the heartbeat,
which also cuts off every attempt once the server has been silent past its fence."""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING

import httpx

from orbit.agent import connection, reports, stopping
from orbit.agent.tracked import Tracked
from orbit.runtime import host_processes, hostside
from orbit.wire import protocol as p

if TYPE_CHECKING:
    from orbit.agent.state import AgentState

log = logging.getLogger("orbit.agent")

INFO_EVERY_S = 30.0  # how often the node's facts are looked at again for the heartbeat


def running(agent: AgentState) -> list[p.RunningAttempt]:
    with agent.lock:
        tracked = list(agent.tracked.values())
    return [
        p.RunningAttempt(
            attempt_id=t.attempt_id,
            fence=t.fence,
            alive=t.alive(),
            ended=(t.folder / "runtime" / "result.json").exists(),
        )
        for t in tracked
    ]


def resync(agent: AgentState) -> None:
    """Tell the server what runs here; stop what it does not know, forget what it lost."""
    info = agent.node_info()
    body = p.SyncRequest(
        node_id=agent.node_id, session=agent.session, running=tuple(running(agent)), info=info
    )
    answer: p.SyncResponse = connection.post(agent, "/sync", body, p.SyncResponse)
    agent.last_info, agent.info_at = info, time.monotonic()
    agent.heartbeat_s, agent.max_tasks = answer.heartbeat_s, answer.max_tasks
    agent.fence.told(answer.fence_after_s)
    with agent.lock:  # report numbers go on: they count within this agent's session
        for t in agent.tracked.values():
            t.files.clear()  # the server says what it has by its answers to reports
    for attempt_id in answer.stop:
        stopping.stop_and_clean(agent, attempt_id)
    for attempt_id in answer.halt:
        stopping.halt(agent, attempt_id, "the control plane gave it up while this node was away")
    for attempt_id in answer.lost:
        with agent.lock:
            agent.tracked.pop(attempt_id, None)
    keep = {a.attempt_id for a in answer.keep}
    # processes of this agent's attempts that it no longer tracks (their folder is gone)
    with agent.lock:
        live = sorted(keep | set(agent.tracked))
    stopped = host_processes.stop_ended(str(agent.attempts_dir), live, agent.plane)
    if stopped.get("stopped"):
        log.warning("stopped processes of attempts the server does not know: %s", stopped)
    stopping.sweep_containers(agent, live)
    agent.report_wake.set()


def restore(agent: AgentState) -> None:
    """The attempts this agent started before it restarted: their markers."""
    for marker in sorted(agent.attempts_dir.glob("*.json")):
        try:
            data = json.loads(marker.read_text())
            folder = agent.attempts_dir / data["attempt_id"]
            if not (folder / "runtime").is_dir():
                continue  # never started: the server will call it lost
            if agent.users is not None:
                agent.users.hold(data["attempt_id"], folder)
            agent.tracked[data["attempt_id"]] = Tracked(
                attempt_id=data["attempt_id"],
                run_id=data["run_id"],
                fence=int(data["fence"]),
                folder=folder,
                launch_mode=data["launch_mode"],
                upload_large=bool(data["upload_large"]),
                done=bool(data.get("done")),
            )
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("%s: not an attempt marker this agent can read; left alone", marker)


def heartbeat_loop(agent: AgentState) -> None:
    last = time.monotonic()
    # in short steps: the interval is the server's (it says at sync), not the one known
    # before the first sync
    while not agent.stop.wait(min(agent.heartbeat_s, 0.1)):
        fence_check(agent)
        if not agent.connected.is_set() or time.monotonic() - last < agent.heartbeat_s:
            continue
        last = time.monotonic()
        info = None
        if time.monotonic() - agent.info_at >= INFO_EVERY_S:
            fresh = agent.node_info()
            agent.info_at = time.monotonic()
            if fresh != agent.last_info:
                info, agent.last_info = fresh, fresh
        body = p.HeartbeatRequest(
            node_id=agent.node_id,
            session=agent.session,
            info=info,
            gpu_utilization=agent.gpu_utilization(),
        )
        try:
            answer: p.HeartbeatResponse = connection.post(
                agent, "/heartbeat", body, p.HeartbeatResponse
            )
        except (httpx.HTTPError, connection.ServerSaid):
            if info is not None:
                agent.last_info = None  # send it again next time
            continue
        agent.heartbeat_s, agent.max_tasks = answer.heartbeat_s, answer.max_tasks
        agent.fence.told(answer.fence_after_s)
        if answer.resync:
            log.warning("the server had this node offline: syncing again")
            agent.connected.clear()


def fence_check(agent: AgentState) -> None:
    """Cut off from the server past its lost timeout: stop every running attempt. (And,
    once a second, give back the users of ended attempts, connected or not.)"""
    if time.monotonic() - agent.released_at >= 1.0:
        agent.released_at = time.monotonic()
        reports.release_users(agent)
    for attempt_id in agent.fence.due(running_ids(agent)):
        stopping.halt(
            agent, attempt_id, f"no word from the server for {agent.fence.silent_s():.0f}s"
        )


def running_ids(agent: AgentState) -> list[str]:
    """The attempts whose wrapper runs here now."""
    with agent.lock:
        tracked = [t for t in agent.tracked.values() if not t.launching]
    return [t.attempt_id for t in tracked if hostside.wrapper_alive(str(t.folder / "runtime"))]
