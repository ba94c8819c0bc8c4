"""Records the control service hands its clients beyond the store's own: a run with what is
known about it (progress, provenance, images), a page of runs, a chunk of log, a plan. They
are the same whether the service runs in this process or behind `orbit server`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orbit.forensics.progress import Progress
from orbit.forensics.rundiff import Difference
from orbit.model.hosts import HostRecord
from orbit.model.models import ExecutionRequest, ExecutionTemplate, Record
from orbit.model.policies import PolicyStamp, PolicyVersion
from orbit.model.records import RunRecord
from orbit.model.secrets import Scope
from orbit.model.storage import RunStorage
from orbit.policy.check import CheckReport
from orbit.policy.replay import DiffReport


class WaitView(Record):
    """What an attempt not launched yet waits for, as it stands when read (never a reason a
    pass wrote long ago): `kind` backoff (a retry's, until `until`), host (its SSH host does
    not answer), room (no node has room now, or could ever: `detail` says which, in figures
    as of now), quota, preempting (work is being stopped for it), placed (on its node, not
    started yet, since `since`), launching (a process is launching it), due (at the next
    look or pass), held (on its run's dependencies, `after:`)."""

    kind: str
    detail: str
    since: datetime | None = None
    until: datetime | None = None


class RunView(Record):
    """A run, with its newest progress, where its code came from, the container image each
    attempt ran (attempt id -> runtime/image.json), where its bundle is cached, and what its
    current attempt waits for, if it is not launched yet."""

    run: RunRecord
    bundle_path: str
    progress: Progress | None = None
    provenance: dict[str, Any] | None = None
    images: dict[str, dict[str, Any]] = {}
    wait: WaitView | None = None
    storage: RunStorage | None = None  # pinned, deleted, expired (one run's view only)

    @property
    def dirty(self) -> bool:
        from orbit.core.execution.provenance import is_dirty

        return is_dirty(self.provenance)


class RunPage(Record):
    """Some runs, newest first, and how many match in all."""

    runs: tuple[RunView, ...]
    total: int


class LogChunk(Record):
    data: bytes
    offset: int  # where to read from next time
    attempt: int  # the attempt's number
    attempt_id: str
    ended: bool  # the attempt had ended when this was read (nothing more will come)


class LogPlace(Record):
    """Where to start reading a log (for its last lines, or those written since a time)."""

    offset: int
    attempt: int  # the attempt's number
    attempt_id: str
    ended: bool  # the attempt had ended when this was found


class TemplateView(Record):
    template: ExecutionTemplate
    path: str  # the file it was read from
    text: str  # the file as written
    canonical_placement: str  # the placement's canonical name (aliases are accepted)


class HostCheck(Record):
    """What `hosts check` found and cleaned up: the host's facts, the ORBIT containers no live
    attempt owns that were removed, and the processes of ended attempts that were stopped
    (attempt id -> pids)."""

    host: HostRecord
    removed_containers: tuple[str, ...] = ()
    sweep_errors: tuple[str, ...] = ()
    stopped_processes: dict[str, tuple[int, ...]] = {}
    process_errors: tuple[str, ...] = ()


class RunDiff(Record):
    a: str
    b: str
    differences: tuple[Difference, ...]


class SecretUse(Record):
    """A run's reference to a secret, as the submitter's would resolve: the variable the task
    gets it in, the secret's name, and whose it is. Never its value."""

    env: str
    name: str
    scope: Scope
    owner: str  # the user's name, the experiment's id, or "" for a global one


class PolicyReview(Record):
    """One policy version as a document for a review: the file as applied, its check (its own
    tests), and what it changed against the version before it over the submissions of the
    window that ended when it was applied."""

    version: PolicyVersion
    check: CheckReport
    diff: DiffReport
    window_end: datetime


class SubmitPlan(Record):
    """What `orbit submit --dry-run` shows: what would run, where, from which bundle."""

    experiment: str
    task_type: str
    template_id: str
    backend_key: str
    target: str | None
    request: ExecutionRequest  # the template with the submission's overrides applied
    job: dict[str, Any]  # job.json as the bundle would hold it
    bundle_digest: str
    bundle_files: int
    bundle_bytes: int
    secrets: list[SecretUse] = []  # which would be used, and from which scope
    policy: PolicyStamp = PolicyStamp()  # what the policy in force says of it


class Explanation(Record):
    """A run's latest scheduler decision (orbit.scheduler.plan's record), the pass that made
    it, and with --replay the decision made again from the stored inputs."""

    decision: dict[str, Any]
    pass_id: str
    replay_identical: bool | None = None
    replayed: dict[str, Any] | None = None


class QueueEntry(Record):
    run: str
    tier: str
    user: str = ""  # who submitted it
    position: int | None  # in its pass; none for one no pass has placed in the queue yet
    # waiting | preempting, or (not in a pass's queue) backoff | placed | due | held (on its
    # dependencies: `after:`)
    outcome: str
    reason: str  # what it waits for, in one line, as of now
    waited_s: float  # since its attempt was made
    # when it may start: the soonest that the attempts in its way must end by (their
    # max_runtime_s); None where one of them has no limit
    estimated_start: datetime | None = None
    waits_for: tuple[str, ...] = ()  # a held run: the runs it waits for that have not ended


class QuotaView(Record):
    scope: str  # user | experiment
    name: str
    gpus: int
    weight: float
    updated_by: str


class Simulation(Record):
    """What a scheduler config would have changed over recorded passes."""

    passes: int
    decisions: int
    placed_elsewhere: list[str]
    placed_instead_of_waiting: list[str]
    waiting_instead_of_placed: list[str]
    preempted_differently: list[str]
    unchanged: int


class SchedConfigView(Record):
    """The scheduler config in force (`orbit sched config show`): its text as written (""
    while the defaults are), where it came from, who made it so and when, what it comes to
    with every default filled in (and the store's quotas), and a refused newer one, if any."""

    text: str
    digest: str
    source: str  # the file, "(defaults)", or the store's last good config
    path: str | None  # the file watched for edits
    set_by: str
    set_at: datetime
    config: dict[str, Any]
    error: str | None = None  # the file holds a config that was refused: why, in one line
    error_since: datetime | None = None
