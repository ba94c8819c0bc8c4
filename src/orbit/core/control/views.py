"""Records the control service hands its clients beyond the store's own: a run with what is
known about it (progress, provenance, images), a page of runs, a chunk of log, a plan. They
are the same whether the service runs in this process or behind `orbit server`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orbit.core.hosts import HostRecord
from orbit.core.models import ExecutionTemplate, Record
from orbit.core.records import RunRecord
from orbit.forensics.progress import Progress
from orbit.forensics.rundiff import Difference


class RunView(Record):
    """A run, with its newest progress, where its code came from, the container image each
    attempt ran (attempt id -> runtime/image.json) and where its bundle is cached."""

    run: RunRecord
    bundle_path: str
    progress: Progress | None = None
    provenance: dict[str, Any] | None = None
    images: dict[str, dict[str, Any]] = {}

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


class SubmitPlan(Record):
    """What `orbit submit --dry-run` shows: what would run, where, from which bundle."""

    experiment: str
    task_type: str
    template_id: str
    backend_key: str
    target: str | None
    request: dict[str, Any]  # the resolved execution request
    job: dict[str, Any]  # job.json as the bundle would hold it
    bundle_digest: str
    bundle_files: int
    bundle_bytes: int


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
    position: int
    outcome: str  # waiting | preempting
    reason: str  # the decision in one line
    waited_s: float
    # when it may start: the soonest that the attempts in its way must end by (their
    # max_runtime_s); None where one of them has no limit
    estimated_start: datetime | None = None


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
