"""Nothing of an ended attempt keeps running: stopping what is left of attempts the control
plane has ended, where their processes outlived its contact with them (a host given up on as
unreachable that comes back with the task still running).

The wrapper stops what its task left behind when the task ends; these cover the attempts whose
end the control plane decided on its own: `orbit cancel` of an ended run, and the host's next
contact (its answer after it did not, `orbit hosts check`, the next launch there).
"""

from __future__ import annotations

from collections.abc import Iterable

from orbit.core.execution.backends.base import ProcessSweep, StopsLeftovers, SweepsEndedProcesses
from orbit.core.execution.service import ExecutionService
from orbit.model.errors import NoBackend, OrbitError, Unreachable
from orbit.model.records import AttemptRecord


def stop_leftovers(
    execution: ExecutionService, attempts: Iterable[AttemptRecord]
) -> dict[str, int]:
    """Stop the processes still carrying the marker of each ended attempt: attempt id -> how
    many were stopped (only those with any). A host that does not answer raises Unreachable
    when no attempt's host did."""
    stopped: dict[str, int] = {}
    missed: list[Unreachable] = []
    for attempt in attempts:
        if not attempt.state.terminal or attempt.handle is None:
            continue  # a live attempt is stopped by a cancel, not here
        try:
            backend = execution.backend(attempt.backend_key)
        except NoBackend:
            continue
        if not isinstance(backend, StopsLeftovers):
            continue
        try:
            count = backend.stop_leftovers(attempt.handle)
        except Unreachable as exc:
            missed.append(exc)
            continue
        if count:
            stopped[attempt.id] = count
    if missed and not stopped:
        raise missed[0]
    return stopped


def sweep_after_contact(
    execution: ExecutionService, attempt: AttemptRecord, live: set[str]
) -> ProcessSweep | None:
    """The host of `attempt` answers again after it did not: the processes there of this
    control plane's attempts that ended meanwhile are stopped. None where the backend has no
    such sweep or the sweep failed (the next contact tries again)."""
    if attempt.handle is None:
        return None
    try:
        backend = execution.backend(attempt.backend_key)
        if not isinstance(backend, SweepsEndedProcesses):
            return None
        return backend.sweep_processes_near(attempt.handle, live)
    except OrbitError:
        return None
