"""What the control service hands to its callers (CLI, HTTP, web page): plain frozen records."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from orbit.model.models import (
    ExecutionRequest,
    FailureReason,
    Record,
    RunHandle,
    RunState,
    TaskSubmission,
)
from orbit.model.policies import PolicyStamp


class ExperimentRecord(Record):
    id: str
    name: str
    created_at: datetime
    run_count: int = 0
    # only its members (and those who manage experiments) see its runs, logs and artifacts
    restricted: bool = False
    members: list[str] = []  # user names (shown to those who see the experiment)


class AttemptRecord(Record):
    id: str
    run_id: str
    number: int
    state: RunState
    reason: FailureReason | None
    target: str | None
    backend_key: str
    trigger: str  # submit | auto_retry | retry
    handle: RunHandle | None
    exit_code: int | None
    message: str | None
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    last_contact_at: datetime | None = None  # its host last answered (SSH hosts)
    unreachable_since: datetime | None = None  # its host has not answered since
    # a prepared attempt: who is launching it, until when that claim holds unrenewed, and the
    # earliest time to launch it (a retry's backoff, a wait for its host)
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    not_before: datetime | None = None
    preempted_by: str | None = None  # the run the scheduler stopped it for
    held: str | None = None  # a prepared attempt held back: `after` (its run's dependencies)
    node: str | None = None  # the agent node it is placed on (agent pools)
    gang_nodes: tuple[str, ...] = ()  # a gang's: every rank's node, rank 0 first

    @property
    def unreachable(self) -> bool:
        return self.unreachable_since is not None and not self.state.terminal

    @property
    def where(self) -> str | None:
        """Where it runs, or ran: its node (a gang's every node), host or cluster; before it
        is placed, the target it was pinned to, if any."""
        if self.gang_nodes:
            return "+".join(self.gang_nodes)
        if self.node is not None:
            return self.node
        if self.handle is not None:
            return self.handle.target
        return self.target


class RunRecord(Record):
    id: str
    experiment_id: str
    experiment_name: str
    task_type: str
    template_id: str
    bundle_digest: str
    submission: TaskSubmission  # as submitted, its experiment and `after` resolved to ids
    request: ExecutionRequest  # the template with the submission's overrides applied
    created_at: datetime
    created_by: str
    replay_of: str | None = None  # the run whose bundle this one replays
    # the policy it was admitted under and what that said (none: made before policies)
    policy: PolicyStamp | None = None
    group_id: str | None = None  # the group a sweep made it in (orbit groups show G)
    attempts: tuple[AttemptRecord, ...]

    @property
    def current(self) -> AttemptRecord:
        return self.attempts[-1]

    @property
    def state(self) -> RunState:
        """A run's state is its current attempt's: a retry opens a new attempt, and no
        terminal state is ever rewritten."""
        return self.current.state


class AuditEvent(Record):
    """One event of the audit trail, chained to the one before it (see orbit.model.audit_chain)."""

    id: int
    at: datetime
    actor: str
    action: str
    run_id: str | None
    attempt_id: str | None
    data: dict[str, Any]
    prev_hash: str | None  # the previous event's `hash`; none for the very first event
    hash: str  # sha256 over this event's content and `prev_hash`
    mac: str | None = None  # HMAC of `hash` under the audit key; none before keying began


class CollectResult(Record):
    """What `collect` brought back, and whether every file matched the manifest."""

    dest: Path
    files: int = 0  # the attempt's files now at dest
    bytes: int = 0  # their size
    moved: int = 0  # the bytes this collect moved (0: dest already had them all)
    verified: bool = False
    problems: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()  # what retention or gc removed (not a problem: said)

    def and_problem(self, problem: str) -> CollectResult:
        """This collect, no longer verified, with what kept it from being whole."""
        return self.model_copy(update={"verified": False, "problems": (*self.problems, problem)})

    def and_rank(self, rank: int, more: CollectResult) -> CollectResult:
        """This collect with a gang's other rank's (collected under nodes/RANK/)."""
        return self.model_copy(
            update={
                "files": self.files + more.files,
                "bytes": self.bytes + more.bytes,
                "moved": self.moved + more.moved,
                "verified": self.verified and more.verified,
                "problems": self.problems + tuple(f"rank {rank}: {p}" for p in more.problems),
            }
        )
