"""The table of allowed state moves. Pure: the store's `move_attempt` is the only writer."""

from __future__ import annotations

from collections.abc import Mapping

from orbit.core.errors import IllegalTransition
from orbit.core.models import FailureReason, RunState

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
