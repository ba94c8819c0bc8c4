"""What the parts of the control service ask of one another, and the registry they ask it
through: a launch that fails ends its attempt (lifecycle), an ended attempt's retry is launched
(launching), a launch asks for a pass (scheduling), a bulk action cancels or retries each run
(actions), a submit checks and a launch opens a run's secrets (secrets), a submit is admitted
under the policy in force (policy). These calls go round in a circle, so no part can be handed
the others as it is made: CoreControlService makes every part, then names these seven here
before any is called.

Each is a Protocol of the calls made between parts, no more: the whole surface one part uses of
another is on this page, and naming it imports no part (no import circle)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from orbit.core.control.views import QueueEntry, SecretUse
    from orbit.model.dependencies import After
    from orbit.model.models import (
        ExecutionOverrides,
        ExecutionRequest,
        ExecutionTemplate,
        RunStatus,
        TaskSubmission,
    )
    from orbit.model.policies import PolicyStamp
    from orbit.model.records import AttemptRecord, RunRecord
    from orbit.scheduler.model import Quota


class Gate(Protocol):  # core/control/dependencies.py
    def held_back(self, run: RunRecord, attempt: AttemptRecord) -> bool: ...
    def resolve_after(self, after: After | None, source: str) -> After | None: ...
    def held_in_queue(self) -> list[QueueEntry]: ...


class Launcher(Protocol):  # core/control/launching.py
    def launch(
        self,
        run: RunRecord,
        attempt: AttemptRecord,
        request: ExecutionRequest,
        actor: str = ...,
        placement: dict[str, Any] | None = ...,
    ) -> None: ...
    def request_for(self, run: RunRecord, attempt: AttemptRecord) -> ExecutionRequest: ...
    def advance_prepared(self, run: RunRecord, attempt: AttemptRecord) -> None: ...
    def unreachable_timeout(self, attempt: AttemptRecord) -> float: ...


class Life(Protocol):  # core/control/lifecycle.py
    def end(self, run_id: str, attempt: AttemptRecord, status: RunStatus, actor: str) -> None: ...
    def claim(self) -> tuple[str, datetime]: ...
    def refresh_run_status(self, ref: str) -> RunRecord: ...
    def refresh_active(self, runs: list[RunRecord]) -> None: ...
    def wait_for(
        self, ref: str, timeout_s: float | None = ..., poll_s: float = ...
    ) -> RunRecord: ...


class Passes(Protocol):  # core/control/scheduling.py
    def request_schedule(self) -> None: ...
    def one_pass_after(self) -> AbstractContextManager[None]: ...
    def check_schedulable(
        self, request: ExecutionRequest, queue_anyway: bool = ..., service_field: str = ...
    ) -> None: ...
    def quotas(self) -> tuple[Quota, ...]: ...


class Actions(Protocol):  # core/control/actions.py
    def cancel_run(self, ref: str, wait_s: float | None = ...) -> RunRecord: ...
    def retry_run(self, ref: str, overrides: ExecutionOverrides | None = ...) -> RunRecord: ...


class Keeper(Protocol):  # core/control/secrets.py
    def uses(
        self, refs: dict[str, str], user: str, experiment_id: str, field: str = ...
    ) -> list[SecretUse]: ...
    def deliver(self, run: RunRecord, attempt_id: str) -> dict[str, str]: ...


class Admitter(Protocol):  # core/control/policy.py
    def admit(
        self,
        request: ExecutionRequest,
        submission: TaskSubmission,
        template: ExecutionTemplate,
        experiment: str,
    ) -> tuple[ExecutionRequest, PolicyStamp]: ...
    def readmit(self, run: RunRecord, request: ExecutionRequest) -> PolicyStamp: ...


class Parts:
    gate: Gate  # `after:`: holds a launch back until what it waits for has ended
    launching: Launcher  # claim, stage, start: the one launch path
    lifecycle: Life  # look, end (the state move), retry
    scheduling: Passes  # passes of the scheduler and the placements they launch
    actions: Actions  # cancel, retry, replay
    secrets: Keeper  # a run's secrets: checked at submit, opened for each launch
    policy: Admitter  # the policy in force, at each submit
