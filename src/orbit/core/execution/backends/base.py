"""The one protocol every backend keeps. A backend holds no live connection between calls:
it reconstructs an attempt's state from the bundle's runtime/ files each time."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from orbit.core.execution.bundle import FrozenBundle
from orbit.core.layers import LogLayer as LogLayer
from orbit.core.models import ExecutionRequest, FailureReason, RunHandle, RunStatus
from orbit.core.records import CollectResult


@dataclass(frozen=True)
class AttemptContext:
    """Who the attempt is. Reaches the task as environment at launch, never the bundle."""

    run_id: str
    attempt_id: str

    def env(self) -> dict[str, str]:
        return {"ORBIT_RUN_ID": self.run_id, "ORBIT_ATTEMPT_ID": self.attempt_id}


class LaunchError(Exception):
    """Staging or starting failed: an infrastructure failure with its reason."""

    def __init__(self, reason: FailureReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ExecutionBackend(Protocol):
    key: str

    def validate(self, request: ExecutionRequest) -> None:
        """Refuse (orbit.core.errors.OrbitError) what this backend cannot run, before anything
        is written."""

    def launch(
        self, bundle: FrozenBundle, request: ExecutionRequest, attempt: AttemptContext
    ) -> RunHandle:
        """Stage the bundle and start it detached; raise LaunchError if it did not start."""
        ...

    def locate(self, request: ExecutionRequest, attempt: AttemptContext) -> RunHandle | None:
        """Where an attempt of this request was launched, for one whose launching process died
        before the store recorded it; None when its folder was never made there (it never
        started). May contact the host (raises Unreachable when it does not answer)."""
        ...

    def status(self, handle: RunHandle) -> RunStatus: ...

    def read_log(self, handle: RunHandle, layer: LogLayer, offset: int) -> tuple[bytes, int]:
        """Bytes of a log from `offset`, and the offset to ask from next time."""
        ...

    def read_file(self, handle: RunHandle, relpath: str) -> bytes | None:
        """A whole file of the attempt's bundle (runtime/precheck.json, ...), None if absent."""
        ...

    def tail_files(self, handle: RunHandle, pattern: str, max_bytes: int) -> dict[str, bytes]:
        """The last `max_bytes` of every file matching a glob relative to the bundle."""
        ...

    def cancel(self, handle: RunHandle, reason: FailureReason) -> None:
        """Ask the wrapper to stop the task gracefully (it kills after the grace period)."""

    def collect(self, handle: RunHandle, dest: Path) -> CollectResult: ...
