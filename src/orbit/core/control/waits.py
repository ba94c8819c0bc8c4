"""What a run not launched yet waits for, made when it is read, never a reason written long
ago: a retry's backoff with its real remaining time, its SSH host, room on a node or a quota
(its scheduler decision, with its figures as of now), a placement not started yet. The same
answers make `orbit queue`: every agent-pool run not launched, not only those a pass keeps
waiting, with how long each has truly waited."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from orbit.core.control.views import QueueEntry, WaitView
from orbit.model.models import RunState
from orbit.model.records import AttemptRecord
from orbit.scheduler.explain import as_of, one_line
from orbit.store.sql import Row, read_time_required

if TYPE_CHECKING:
    from orbit.store import Store

WAITING = ("waiting", "preempting")  # a pass's outcomes that keep a run in its queue
SHOWN_LAST = 1 << 30  # the position of those no pass has in its queue: after those it has


def waits_of(store: Store, attempts: list[AttemptRecord]) -> dict[str, WaitView]:
    """attempt id -> what it waits for, of those not launched yet."""
    prepared = [a for a in attempts if a.state is RunState.PREPARED]
    if not prepared:
        return {}
    decisions = store.waits.decisions_of(sorted({a.run_id for a in prepared}))
    at = datetime.now(UTC)
    out = {}
    for attempt in prepared:
        wait = wait_of(attempt, _own(decisions.get(attempt.run_id), attempt), at)
        if wait is not None:
            out[attempt.id] = wait
    return out


def _own(row: Row | None, attempt: AttemptRecord) -> Row | None:
    """The run's decision if it is this attempt's (an earlier attempt's says nothing now)."""
    return row if row is not None and row["attempt_id"] == attempt.id else None


def wait_of(attempt: AttemptRecord, decision: Row | None, at: datetime) -> WaitView | None:
    """What `attempt` (prepared) waits for at `at`; `decision`: its scheduler decision."""
    if attempt.cancel_requested:
        return None  # being cancelled: its outcome says so
    if attempt.held:  # on its run's dependencies (`after:`): its message names them
        said = attempt.message or "waiting for its dependencies"
        return WaitView(kind="held", detail=said, since=attempt.created_at)
    if attempt.unreachable:
        said = attempt.message or f"its host {attempt.target} does not answer"
        return WaitView(kind="host", detail=said, since=attempt.unreachable_since)
    if attempt.lease_owner and attempt.lease_expires_at and attempt.lease_expires_at > at:
        return WaitView(kind="launching", detail=f"being launched by {attempt.lease_owner}")
    if decision is not None:
        return _decided(attempt, decision, at)
    if attempt.not_before is not None and attempt.not_before > at:
        return WaitView(
            kind="backoff",
            detail=f"{attempt.trigger} backoff",
            since=attempt.created_at,
            until=attempt.not_before,
        )
    pool = attempt.backend_key.startswith("agent_pool")
    next_step = "the scheduler's next pass places it" if pool else "launched at the next look"
    return WaitView(kind="due", detail=next_step, since=attempt.not_before or attempt.created_at)


def _decided(attempt: AttemptRecord, decision: Row, at: datetime) -> WaitView:
    record: dict[str, Any] = json.loads(decision["body"])
    decided_at = read_time_required(decision["at"])
    outcome = record["outcome"]
    if outcome == "placed":
        # what holds its start, where the launch said (`placed on gpu-b: waiting for attempt
        # 1's files ...`); else where it was placed
        said = attempt.message or ""
        detail = said if said.startswith("placed on ") else one_line(record)
        return WaitView(kind="placed", detail=detail, since=decided_at)
    line = one_line(as_of(record, (at - decided_at).total_seconds()))
    if outcome == "preempting":
        return WaitView(kind="preempting", detail=line, since=attempt.created_at)
    first = (record.get("alternatives") or [{}])[0]
    kind = "quota" if "quota" in first else "room"
    return WaitView(kind=kind, detail=line, since=attempt.created_at)


def queue_entries(store: Store) -> list[QueueEntry]:
    """Agent-pool runs not launched yet: those a pass keeps waiting, by tier and position,
    then the others (in a retry's backoff, placed and not started, due a pass), oldest
    first; each with what it waits for now and how long it has waited."""
    pending = store.waits.pool_not_launched()
    decisions = store.waits.decisions_of(sorted({a.run_id for a, _, _ in pending}))
    at = datetime.now(UTC)
    entries = []
    for attempt, tier, user in pending:
        if attempt.held:
            continue  # held on its dependencies: listed with them (held_in_queue)
        decision = _own(decisions.get(attempt.run_id), attempt)
        wait = wait_of(attempt, decision, at)
        if wait is None:
            continue
        queued = decision is not None and decision["outcome"] in WAITING
        entries.append(
            QueueEntry(
                run=attempt.run_id,
                user=user,
                tier=decision["tier"] if decision is not None else tier,
                position=int(decision["position"]) if queued and decision else None,
                outcome=decision["outcome"] if queued and decision else wait.kind,
                reason=wait.detail if queued else reason(wait, at),
                waited_s=round(max(0.0, (at - attempt.created_at).total_seconds()), 1),
                estimated_start=_estimated(decision) if queued else None,
            )
        )
    entries.sort(key=lambda e: SHOWN_LAST if e.position is None else e.position)
    return entries


def _estimated(decision: Row | None) -> datetime | None:
    body = json.loads(decision["body"]) if decision is not None else {}
    eta = body.get("estimated_start")
    return datetime.fromtimestamp(eta, UTC) if eta else None


def reason(wait: WaitView, at: datetime) -> str:
    """A wait in words, its times counted from `at` (the reader's now)."""
    if wait.kind == "backoff" and wait.until is not None:
        left = int((wait.until - at).total_seconds() + 0.999)
        return f"starts in {left}s ({wait.detail})" if left > 0 else f"due now ({wait.detail})"
    if wait.kind == "room":
        return f"waits for room: {wait.detail}"
    if wait.kind == "quota":
        return f"waits for its quota: {wait.detail.removeprefix('quota: ')}"
    if wait.kind == "host":
        return f"waiting for its host: {wait.detail}"
    if wait.kind == "placed":
        ago = int((at - wait.since).total_seconds()) if wait.since else 0
        if ":" in wait.detail:  # it says what holds the start
            return f"{wait.detail} (placed {ago}s ago)"
        return f"{wait.detail} {ago}s ago, not started yet"
    if wait.kind == "due":
        return f"due now: {wait.detail}"
    return wait.detail
