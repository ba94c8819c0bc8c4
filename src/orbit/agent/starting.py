"""Starting an attempt: claimed from the server (the fencing check) and never twice, staged,
then launched with the local backends as its own user, on its own CPUs and GPUs."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from orbit.agent import connection, staging
from orbit.agent.connection import RETRY_MAX_S, RETRY_MIN_S
from orbit.agent.tracked import Tracked, has_ended, pinned, write_failed, write_json
from orbit.core.execution.backends.base import AttemptContext, LaunchError
from orbit.model.backoff import Backoff
from orbit.model.models import ExecutionRequest, FailureReason
from orbit.wire import protocol as p

if TYPE_CHECKING:
    from orbit.agent.state import AgentState

log = logging.getLogger("orbit.agent")


def claim(agent: AgentState, start: p.StartAttempt, refuse: str | None = None) -> p.ClaimResponse:
    """Asked up to three times: the same claim is granted again (an answer lost)."""
    body = p.ClaimRequest(
        node_id=agent.node_id, attempt_id=start.attempt_id, fence=start.fence, refuse=refuse
    )
    # drawn from windows of 0.4 and 0.8 s: on average as patient as the fixed 0.2 + 0.4 s
    # before, so a restarting server is still waited for as long
    waits = Backoff(base_s=2 * RETRY_MIN_S, cap_s=RETRY_MAX_S)
    for attempt in range(3):
        try:
            answer: p.ClaimResponse = connection.post(agent, "/claim", body, p.ClaimResponse)
            return answer
        except (httpx.HTTPError, connection.ServerSaid) as exc:
            if attempt == 2:
                raise
            agent.stop.wait(waits.next(connection.asked(exc)))
    raise AssertionError("unreachable")


def start(agent: AgentState, start: p.StartAttempt) -> None:
    with agent.attempt_lock(start.attempt_id):
        folder = agent.attempts_dir / start.attempt_id
        marker = agent.attempts_dir / f"{start.attempt_id}.json"
        if folder.exists() or marker.exists() or start.attempt_id in agent.tracked:
            return  # started here before: never twice
        if start.attempt_id in agent.cancelled:
            claim(agent, start, refuse=p.CANCELLED_BEFORE_START)
            return
        with agent.lock:
            busy = sum(1 for t in agent.tracked.values() if not has_ended(t))
        # the server's figure at placement: the last heartbeat's may be older (raised since)
        slots = agent.max_tasks if start.max_tasks is None else start.max_tasks
        if busy >= slots:
            claim(agent, start, refuse=f"at capacity ({busy} of max_tasks {slots})")
            return
        request = ExecutionRequest.model_validate(start.request)
        tracked = Tracked(
            attempt_id=start.attempt_id,
            run_id=start.run_id,
            fence=start.fence,
            folder=folder,
            launch_mode=request.launch_mode.kind,
            upload_large=start.upload_large,
            launching=True,
        )
        # tracked before the claim: a resync while the claim is on its way reports it, so
        # the server never takes a start it granted for one the node lacks
        with agent.lock:
            agent.tracked[start.attempt_id] = tracked
        try:
            answer = claim(agent, start)
        except BaseException:
            with agent.lock:
                agent.tracked.pop(start.attempt_id, None)
            raise
        if not answer.granted:
            with agent.lock:
                agent.tracked.pop(start.attempt_id, None)
            log.warning("start of %s not granted: %s", start.attempt_id, answer.why)
            return
        write_json(marker, tracked.marker())
        try:
            if answer.secrets_error:  # the run's secrets could not be had: it cannot start
                raise LaunchError(FailureReason.LAUNCH_FAILED, answer.secrets_error)
            bundle = staging.bundle(agent, start.bundle_digest)
            if agent.fence.cut_off():  # (a fetch that outlasted the server's patience)
                raise staging.CutOff(
                    f"not started: no word from the server for {agent.fence.silent_s():.0f}s, "
                    "which gives it up and retries it elsewhere"
                )
            launch(agent, bundle, request, start, answer.secrets)
        except Exception as exc:  # it did not start: its end says why
            reason = FailureReason.LAUNCH_FAILED
            if isinstance(exc, staging.StagingError):
                reason = FailureReason.STAGING_FAILED
            elif isinstance(exc, staging.CutOff):
                reason = FailureReason.NODE_LOST
            elif isinstance(exc, LaunchError):  # the backend's own word for it
                reason = exc.reason
            write_failed(folder, reason.value, str(exc))
        finally:
            tracked.launching = False
        agent.report_wake.set()


def launch(
    agent: AgentState,
    bundle: Path,
    request: ExecutionRequest,
    start: p.StartAttempt,
    secrets: dict[str, str] | None = None,
) -> None:
    """Start the staged attempt with the node's own backend; `secrets` (the claim's answer
    brought them) go to its wrapper's stdin."""
    from orbit.core.execution.bundle import FrozenBundle

    backend = node_backend(agent, request.launch_mode.kind, start.gpu_indices, start.attempt_id)
    staged = staging.stage_resume(agent, start)
    context = AttemptContext(
        run_id=start.run_id,
        attempt_id=start.attempt_id,
        resume_staged=str(staged) if staged else None,
        resume_relpath=start.resume.relpath if staged and start.resume else None,
        services=dict(agent.o.services),
        gang=start.gang.model_dump() if start.gang else None,
        secrets=secrets or {},
    )
    cpus = cpus_for(agent, request.resources.cpu_count, start.attempt_id)
    before = os.sched_getaffinity(0)
    try:
        if cpus:
            os.sched_setaffinity(0, cpus)  # this thread only: the wrapper inherits it
        backend.launch(FrozenBundle(start.bundle_digest, bundle), request, context)
    finally:
        if cpus:
            os.sched_setaffinity(0, before)


def node_backend(
    agent: AgentState, launch_mode: str, gpus: tuple[int, ...], attempt_id: str
) -> Any:
    from orbit.agent.isolation import AttemptUser
    from orbit.core.execution.backends.local_docker import LocalDockerBackend
    from orbit.core.execution.backends.local_host_process import LocalHostProcessBackend
    from orbit.core.execution.bundle import FrozenBundle

    env = {
        "ORBIT_PLANE": agent.plane,
        "ORBIT_NODE_NAME": agent.identity.get("name", ""),
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)),
        **agent.fence.wrapper_env(),
    }
    if gpus:
        env["ORBIT_GPUS"] = ",".join(map(str, gpus))
    base: type[LocalHostProcessBackend] = (
        LocalDockerBackend if launch_mode == "docker" else LocalHostProcessBackend
    )

    class NodeBackend(base):  # type: ignore[valid-type,misc]
        # a cache no task can write (tasks run as users of their own) hands on its .pyc
        pycache = agent.users is not None
        cache_name = "this node's"

        def launch_env(self) -> dict[str, str]:
            return {**super().launch_env(), **env}

        def bundle_changed(self, bundle: FrozenBundle) -> None:
            staging.forget_bundle(agent, bundle.digest)

    backend = NodeBackend(agent.attempts_dir)
    if agent.users is not None and base is LocalHostProcessBackend:
        backend.task_user = AttemptUser(agent.users, attempt_id)
    return backend


def cpus_for(agent: AgentState, count: int, attempt_id: str) -> set[int]:
    """CPUs for a host process (taskset): `count` of this agent's, those other attempts
    were given last; none (no pinning) when count is 0 or more than there are."""
    have = sorted(os.sched_getaffinity(0))
    if count <= 0 or count >= len(have):
        return set()
    with agent.lock:
        used = {c for t in agent.tracked.values() if not has_ended(t) for c in pinned(t)}
    free = [c for c in have if c not in used] + [c for c in have if c in used]
    chosen = set(free[:count])
    with contextlib.suppress(OSError):
        (agent.attempts_dir / f"{attempt_id}.cpus").write_text(",".join(map(str, sorted(chosen))))
    return chosen
