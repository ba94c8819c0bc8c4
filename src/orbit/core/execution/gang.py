"""A run across several nodes (num_nodes > 1), whatever places it (an agent pool's gang, one
Slurm job of N nodes): the port its ranks meet on, and its one status made of every rank's.
Pure: no I/O."""

from __future__ import annotations

import hashlib

from orbit.core.models import FailureReason, RunState, RunStatus

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


def master_port(attempt_id: str) -> int:
    """The port a gang meets on at its rank 0: one of 29500-39499 by the attempt's id, the
    same however often it is asked (a restarted launcher, a requeued start)."""
    digest = hashlib.sha256(attempt_id.encode()).digest()
    return 29500 + int.from_bytes(digest[:4], "big") % 10000


def going_on(status: RunStatus) -> RunStatus:
    """A gang's status while a rank still runs: rank 0's, or running if rank 0 has ended."""
    if not status.state.terminal:
        return status
    return status.model_copy(
        update={"state": RunState.RUNNING, "finished_at": None, "exit_code": None}
    )


def gang_status(ranks: list[tuple[str, RunStatus]]) -> RunStatus:
    """The gang's status from each rank's (where it ran, its status; rank 0 first): failed as
    soon as one rank has failed, saying which and where (a failure of the infrastructure before
    a task's own, then the lowest rank), succeeded once every rank has, else going on."""
    first = ranks[0][1]
    failed = [
        (rank, where, status)
        for rank, (where, status) in enumerate(ranks)
        if status.state.terminal and status.state is not RunState.SUCCEEDED
    ]
    if failed:
        rank, where, status = min(failed, key=lambda f: (f[2].reason not in INFRA_REASONS, f[0]))
        why = f"rank {rank} ({where}): {status.message or status.state.value}"
        return status.model_copy(update={"message": why})
    if all(status.state is RunState.SUCCEEDED for _, status in ranks):
        return first
    return going_on(first)
