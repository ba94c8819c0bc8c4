"""A run across several nodes (num_nodes > 1), whatever places it (an agent pool's gang, one
Slurm job of N nodes): the port its ranks meet on, and its one status made of every rank's.
Pure: no I/O."""

from __future__ import annotations

import hashlib

from orbit.model.models import FailureReason, RunState, RunStatus

# a gang's ending is said by the rank that failed for one of these, before one whose task failed
# (the task of a rank whose peer vanished fails too: the peer's loss is the cause)
INFRA_REASONS = frozenset(
    {
        FailureReason.NODE_LOST,
        FailureReason.LAUNCH_FAILED,
        FailureReason.STAGING_FAILED,
        FailureReason.RUNTIME_LOST,
    }
)


# the stops ORBIT itself asks every rank for (orbit cancel, max_runtime_s)
ASKED_STOPS = frozenset({FailureReason.CANCELLED, FailureReason.MAX_RUNTIME})


def master_port(attempt_id: str) -> int:
    """The port a gang meets on at its rank 0: one of 20000-31999 by the attempt's id, the
    same however often it is asked (a restarted launcher, a requeued start). Below Linux's
    ephemeral ports (32768 and up), which any outgoing connection on the node may hold."""
    digest = hashlib.sha256(attempt_id.encode()).digest()
    return 20000 + int.from_bytes(digest[:4], "big") % 12000


def going_on(status: RunStatus) -> RunStatus:
    """A gang's status while a rank still runs: rank 0's, or running if rank 0 has ended."""
    if not status.state.terminal:
        return status
    return status.model_copy(
        update={"state": RunState.RUNNING, "finished_at": None, "exit_code": None}
    )


def gang_status(ranks: list[tuple[str, RunStatus]]) -> RunStatus:
    """The gang's status from each rank's (where it ran, its status; rank 0 first).

    A rank that failed ends the gang at once, saying which and where (a failure of the
    infrastructure before a task's own, then the lowest rank): its peers are stopped. A rank
    that was stopped (a cancel, the time limit, a preemption) does not end it while its peers
    are still stopping: each has its grace period. Once all have ended, a stop ORBIT asked
    for explains the gang (a rank that died without a result meanwhile is its consequence),
    then a failure as above. It succeeds once every rank has."""
    first = ranks[0][1]
    ended = [
        (rank, where, status)
        for rank, (where, status) in enumerate(ranks)
        if status.state.terminal and status.state is not RunState.SUCCEEDED
    ]
    if not ended:
        return first if all(s.state is RunState.SUCCEEDED for _, s in ranks) else going_on(first)
    asked = any(s.reason in ASKED_STOPS for _, _, s in ended)
    failed = [e for e in ended if e[2].state is RunState.FAILED]
    consequences = asked and all(s.reason is FailureReason.RUNTIME_LOST for _, _, s in failed)
    if failed and not consequences:
        return _said(min(failed, key=lambda e: (e[2].reason not in INFRA_REASONS, e[0])))
    if not all(s.state.terminal for _, s in ranks):
        return going_on(first)
    return _said(
        min(
            ended,
            key=lambda e: (e[2].reason not in ASKED_STOPS, e[2].reason not in INFRA_REASONS, e[0]),
        )
    )


def _said(ended: tuple[int, str, RunStatus]) -> RunStatus:
    rank, where, status = ended
    why = f"rank {rank} ({where}): {status.message or status.reason or status.state.value}"
    return status.model_copy(update={"message": why})
