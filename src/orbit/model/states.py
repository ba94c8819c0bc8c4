"""Run states, failure reasons and the table of allowed moves. Pure and stdlib-only (the CLI
reads these words without loading pydantic); the store's `move_attempt` and `record_launch`
(orbit/store/attempt_states.py) are the only writers, and check every move against ALLOWED."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from orbit.model.errors import IllegalTransition


class RunState(StrEnum):
    PREPARED = "prepared"
    SUBMITTED = "submitted"
    PROVISIONING = "provisioning"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TERMINATED = "terminated"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.TERMINATED})


class FailureKind(StrEnum):
    INFRASTRUCTURE = "infrastructure"  # the box, the transport, ORBIT's own runtime
    TASK = "task"  # the task's own doing
    USER = "user"  # a person asked for it
    ENVIRONMENT = "environment"  # the node's software is not what the job declared
    PIPELINE = "pipeline"  # a run it was to follow (`after: ok`) did not succeed


class FailureReason(StrEnum):
    """The closed set of reasons an attempt ends other than in success."""

    NODE_LOST = "node_lost"
    HOST_UNREACHABLE = "host_unreachable"
    STAGING_FAILED = "staging_failed"
    LAUNCH_FAILED = "launch_failed"
    RUNTIME_LOST = "runtime_lost"
    PREEMPTED = "preempted"
    TASK_EXIT_NONZERO = "task_exit_nonzero"
    TASK_KILLED = "task_killed"
    MAX_RUNTIME = "max_runtime"  # it ran past its max_runtime_s and was stopped
    CANCELLED = "cancelled"
    DEPENDENCY_MISSING = "dependency_missing"
    DEPENDENCY_MISMATCH = "dependency_mismatch"
    IMAGE_NOT_FOUND = "image_not_found"  # a docker launch's image is not on the host, nor pulled
    DEPENDENCY_FAILED = "dependency_failed"  # a run named under `after: ok` ended otherwise

    @property
    def kind(self) -> FailureKind:
        return _REASON_KINDS[self]


_REASON_KINDS = {
    FailureReason.NODE_LOST: FailureKind.INFRASTRUCTURE,
    FailureReason.HOST_UNREACHABLE: FailureKind.INFRASTRUCTURE,
    FailureReason.STAGING_FAILED: FailureKind.INFRASTRUCTURE,
    FailureReason.LAUNCH_FAILED: FailureKind.INFRASTRUCTURE,
    FailureReason.RUNTIME_LOST: FailureKind.INFRASTRUCTURE,
    FailureReason.PREEMPTED: FailureKind.INFRASTRUCTURE,
    FailureReason.TASK_EXIT_NONZERO: FailureKind.TASK,
    FailureReason.TASK_KILLED: FailureKind.TASK,
    FailureReason.MAX_RUNTIME: FailureKind.TASK,
    FailureReason.CANCELLED: FailureKind.USER,
    FailureReason.DEPENDENCY_MISSING: FailureKind.ENVIRONMENT,
    FailureReason.DEPENDENCY_MISMATCH: FailureKind.ENVIRONMENT,
    FailureReason.IMAGE_NOT_FOUND: FailureKind.ENVIRONMENT,
    FailureReason.DEPENDENCY_FAILED: FailureKind.PIPELINE,
}

S = RunState
_ENDINGS = frozenset({S.SUCCEEDED, S.FAILED, S.TERMINATED})

# Moves go forward only. Intermediate states may be skipped: a short task can start and finish
# between two looks at it. Terminal states have no way out.
ALLOWED: Mapping[RunState, frozenset[RunState]] = {
    S.PREPARED: frozenset({S.SUBMITTED}) | _ENDINGS,
    S.SUBMITTED: frozenset({S.PROVISIONING, S.STARTING, S.RUNNING}) | _ENDINGS,
    S.PROVISIONING: frozenset({S.STARTING, S.RUNNING}) | _ENDINGS,
    S.STARTING: frozenset({S.RUNNING}) | _ENDINGS,
    S.RUNNING: _ENDINGS,
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.TERMINATED: frozenset(),
}


def check_move(current: RunState, new: RunState, reason: FailureReason | None) -> None:
    """Raise IllegalTransition unless `current -> new` is in the table and the reason fits."""
    if new not in ALLOWED[current]:
        raise IllegalTransition(f"{current} -> {new} is not an allowed move")
    if new in (S.FAILED, S.TERMINATED) and reason is None:
        raise IllegalTransition(f"moving to {new} needs a reason")
    if new not in (S.FAILED, S.TERMINATED) and reason is not None:
        raise IllegalTransition(f"{new} carries no failure reason (got {reason})")
