"""Stopping attempts: a cancel (gracefully, then by force past its grace), a halt of what the
server gave up on (its folder kept: its files still go up), a stop-and-clean of what the
server does not know, and a sweep of what a dead wrapper left running."""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
from typing import TYPE_CHECKING

from orbit.agent import connection
from orbit.agent.tracked import Tracked
from orbit.runtime import host_processes, hostside
from orbit.wire import protocol as p

if TYPE_CHECKING:
    from orbit.agent.state import AgentState

log = logging.getLogger("orbit.agent")

FORCE_AFTER_S = 10.0  # past an attempt's grace, what still runs of it is killed outright


def sweep_containers(agent: AgentState, live: list[str]) -> None:
    if shutil.which("docker") is None:
        return
    from orbit.core.execution.docker.host import local_runner, sweep_orphans

    with contextlib.suppress(Exception):
        sweep_orphans(local_runner, live, plane=agent.plane)


def halt(agent: AgentState, attempt_id: str, why: str) -> None:
    """Stop what runs of an attempt the server has given up on (lost), gracefully for at
    most FENCE_STOP_S, and keep its folder: its files still go up (its checkpoint is what
    its retry resumes from)."""
    from orbit.model.config import FENCE_STOP_S

    folder = agent.attempts_dir / attempt_id
    if not (folder / "runtime").is_dir():
        return
    log.warning("stopping attempt %s: %s", attempt_id, why)
    try:
        if not hostside.cancel(str(folder), "node_lost", grace_s=FENCE_STOP_S, message=why):
            host_processes.stop_attempt(str(folder), attempt_id)  # no wrapper: what it left
    except OSError as exc:  # what the task left in runtime/ (a folder, say): not fatal
        log.warning("stopping attempt %s: %s", attempt_id, exc)
    force_stop_later(agent, attempt_id, FENCE_STOP_S + FORCE_AFTER_S)
    agent.report_wake.set()


def force_stop_later(agent: AgentState, attempt_id: str, delay: float) -> None:
    """Once `delay` is over, kill what still runs of the attempt: every process of its
    user (a task that stopped its own wrapper ignores the wrapper's grace), or, sharing
    the agent's user, every process with its marks."""
    timer = threading.Timer(delay, force_stop, (agent, attempt_id))
    timer.daemon = True
    timer.start()


def force_stop(agent: AgentState, attempt_id: str) -> None:
    try:
        uid = agent.users.uid_of(attempt_id) if agent.users is not None else None
        if uid is not None:
            from orbit.agent.isolation import kill_user

            kill_user(uid)
        else:
            folder = agent.attempts_dir / attempt_id
            if folder.is_dir():
                host_processes.stop_attempt(str(folder), attempt_id)
    except Exception:  # a timer's thread: said, never raised
        log.exception("stopping what is left of attempt %s", attempt_id)


def stop_and_clean(agent: AgentState, attempt_id: str) -> None:
    folder = agent.attempts_dir / attempt_id
    log.warning("stopping attempt %s: the server does not expect it here", attempt_id)
    if folder.is_dir():
        host_processes.stop_attempt(str(folder), attempt_id)
    if agent.users is not None:
        agent.users.give_back(attempt_id, folder)
    remove_containers(attempt_id)
    with agent.lock:
        agent.tracked.pop(attempt_id, None)
    shutil.rmtree(folder, ignore_errors=True)
    (agent.attempts_dir / f"{attempt_id}.json").unlink(missing_ok=True)


def cancel(agent: AgentState, body: p.CancelAttempt) -> None:
    with agent.attempt_lock(body.attempt_id):
        with agent.lock:
            tracked = agent.tracked.get(body.attempt_id)
            if tracked is None:
                agent.cancelled.add(body.attempt_id)
        if tracked is not None:
            try:
                hostside.cancel(str(tracked.folder), body.reason)
            except OSError as exc:  # what the task left in runtime/: said, not fatal
                log.warning("cancelling attempt %s: %s", body.attempt_id, exc)
            # whatever its task did to its wrapper, nothing of it outlives the grace
            grace = host_processes.stop_grace(str(tracked.folder))
            force_stop_later(agent, body.attempt_id, grace + FORCE_AFTER_S)
            agent.report_wake.set()
        elif body.fence and not (agent.attempts_dir / body.attempt_id).exists():
            # not started here (its start is on its way, or lost): it never will be
            refuse = p.ClaimRequest(
                node_id=agent.node_id,
                attempt_id=body.attempt_id,
                fence=body.fence,
                refuse=p.CANCELLED_BEFORE_START,
            )
            connection.post(agent, "/claim", refuse, p.ClaimResponse)


def sweep_dead(agent: AgentState, t: Tracked) -> None:
    """Stop what an attempt whose wrapper died left running: its task (by the pid its
    status names, when it still carries the attempt's marks), the processes with its
    marks, and its containers."""
    hostside.probe(str(t.folder), t.attempt_id)
    if t.launch_mode == "docker":
        remove_containers(t.attempt_id)


def remove_containers(attempt_id: str) -> None:
    """The attempt's containers, by their labels, where this node has Docker."""
    if shutil.which("docker") is None:
        return
    from orbit.core.execution.docker.host import local_runner, remove_attempt_containers

    with contextlib.suppress(Exception):
        remove_attempt_containers(local_runner, attempt_id)
