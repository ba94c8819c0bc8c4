"""Acting on many runs at once (`orbit cancel`/`retry` of several ids or of a filter): which
runs a selection takes, and what became of each. Pure records; the control plane carries the
action out (orbit.core.control.bulk) and clients say it in words."""

from __future__ import annotations

from collections import Counter
from enum import StrEnum

from pydantic import Field

from orbit.model.models import Record
from orbit.model.states import RunState

MAX_RUNS = 10_000  # runs one call acts on; a larger match is refused, to be narrowed


class RunSelection(Record):
    """These runs (ids or unique prefixes), or the runs a filter matches: of an experiment,
    in one of some states (the current attempt's), made by a user. Never both, never neither:
    nothing selects every run by leaving things out."""

    ids: tuple[str, ...] = Field(default=(), max_length=MAX_RUNS)
    experiment: str | None = None
    group: str | None = None  # a sweep's runs (orbit.model.groups), by id or prefix
    states: tuple[RunState, ...] = ()
    user: str | None = None
    # a filter leaves out the runs of the restricted experiments this user is not a member of
    # (the server's to set for its caller; never sent)
    viewer: str | None = Field(default=None, exclude=True)

    @property
    def by_filter(self) -> bool:
        return bool(self.experiment or self.group or self.states or self.user)

    def problem(self) -> str | None:
        """Why this selects nothing it could act on, or None."""
        if self.ids and self.by_filter:
            return "give run ids or a filter (experiment, group, state, user), not both"
        if not self.ids and not self.by_filter:
            return "give run ids, or a filter (experiment, group, state, user) to act on many runs"
        return None

    def describe(self) -> str:
        """`experiment 'sweep', state running, user mia`, or the ids."""
        if self.ids:
            return ", ".join(self.ids)
        parts = [f"experiment '{self.experiment}'"] if self.experiment else []
        if self.group:
            parts.append(f"group '{self.group}'")
        if self.states:
            parts.append("state " + " or ".join(s.value for s in self.states))
        if self.user:
            parts.append(f"user '{self.user}'")
        return ", ".join(parts)


class BulkOutcome(StrEnum):
    """What became of one run of a bulk action (a closed set)."""

    CANCELLED = "cancelled"  # its stop was asked for: ended, or stopping now
    RETRIED = "retried"  # a new attempt was made
    ALREADY_ENDED = "already_ended"  # cancel: it had ended, nothing to stop
    NOT_ENDED = "not_ended"  # retry: it has not ended (cancel it first)
    REFUSED = "refused"  # the caller may not control it (a member: another user's run)
    FAILED = "failed"  # the action failed for it; `message` says why
    WOULD_CANCEL = "would_cancel"  # a dry run's
    WOULD_RETRY = "would_retry"


FAILURES = frozenset({BulkOutcome.REFUSED, BulkOutcome.FAILED})


class BulkItem(Record):
    run: str
    user: str  # who made the run
    state: RunState  # after the action (before it, in a dry run)
    outcome: BulkOutcome
    message: str = ""
    attempt: int | None = None  # the run's current attempt after the action


class BulkResult(Record):
    """A bulk action's report: every run the selection took, newest first for a cancel (a
    run is stopped before what it waits for), oldest first for a retry (what a run waits for
    is retried first, so the retried run waits for its new attempt)."""

    action: str  # cancel | retry
    dry_run: bool
    selection: RunSelection
    items: tuple[BulkItem, ...]

    def counts(self) -> dict[str, int]:
        """How many runs of each outcome, in the order of BulkOutcome."""
        found = Counter(item.outcome for item in self.items)
        return {o.value: found[o] for o in BulkOutcome if found[o]}

    @property
    def any_failed(self) -> bool:
        return any(item.outcome in FAILURES for item in self.items)
