"""The audit trail's hash chain: pure functions, no database.

Every event stores the digest of the event before it (`prev_hash`, none for the very first) and
its own digest (`hash`) over a canonical encoding of its content and that `prev_hash`. Changing
an event's content breaks its own digest; deleting or inserting an event breaks the link of the
one after it. (Dropping events from the end leaves a shorter chain that is still whole: keep the
head digest somewhere else to tell that apart.)

The encoding below is a stored format. Existing chains were hashed with it, so it must never
change; a new encoding would need its own version and a migration that re-chains the store.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol


def canonical_at(at: datetime) -> str:
    """ISO 8601 in UTC with microseconds, e.g. `2026-11-20T09:30:01.000250Z`. A naive value is
    taken as UTC (SQLite hands datetimes back without a zone). Microseconds are what both
    SQLite (as text) and PostgreSQL (timestamptz) keep, so the value hashed when the event was
    written is the value read back from either."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def canonical_data(data: dict[str, Any]) -> dict[str, Any]:
    """`data` as it reads back from a JSON column: tuples become lists, keys become strings.
    The writer stores this form, so what it hashed is exactly what a reader gets."""
    loaded: dict[str, Any] = json.loads(json.dumps(data))
    return loaded


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def event_hash(
    *,
    prev_hash: str | None,
    at: datetime,
    actor: str,
    action: str,
    run_id: str | None,
    attempt_id: str | None,
    data: dict[str, Any],
) -> str:
    """sha256 (hex) of the UTF-8 bytes of the compact JSON array
    `[prev_hash or "", at (canonical_at), actor, action, run_id, attempt_id, data]`,
    object keys sorted. A JSON array delimits its fields, so no two contents share an encoding,
    and `null` (no run) stays apart from `""`."""
    encoded = _json([prev_hash or "", canonical_at(at), actor, action, run_id, attempt_id, data])
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


class ChainedEvent(Protocol):
    """What verification reads of an event (an `AuditEvent` has all of it)."""

    @property
    def id(self) -> int: ...
    @property
    def at(self) -> datetime: ...
    @property
    def actor(self) -> str: ...
    @property
    def action(self) -> str: ...
    @property
    def run_id(self) -> str | None: ...
    @property
    def attempt_id(self) -> str | None: ...
    @property
    def data(self) -> dict[str, Any]: ...
    @property
    def prev_hash(self) -> str | None: ...
    @property
    def hash(self) -> str | None: ...


@dataclass(frozen=True)
class ChainCheck:
    """The outcome of walking a chain: how many events, the last digest, what is wrong."""

    events: int
    head: str | None
    problems: tuple[str, ...]

    @property
    def intact(self) -> bool:
        return not self.problems


def check_chain(events: Iterable[ChainedEvent]) -> ChainCheck:
    """Walk `events` in the order they were written (by id) and name every event whose
    content no longer matches its digest, and every link that does not meet its predecessor."""
    problems: list[str] = []
    count = 0
    previous: ChainedEvent | None = None
    for event in events:
        count += 1
        if not event.hash:
            problems.append(f"event {event.id}: has no hash")
        else:
            computed = event_hash(
                prev_hash=event.prev_hash,
                at=event.at,
                actor=event.actor,
                action=event.action,
                run_id=event.run_id,
                attempt_id=event.attempt_id,
                data=event.data,
            )
            if computed != event.hash:
                problems.append(
                    f"event {event.id}: content altered "
                    f"(stored hash {event.hash[:12]}, content hashes to {computed[:12]})"
                )
        if previous is None:
            if event.prev_hash:
                problems.append(
                    f"event {event.id}: broken link: it follows {event.prev_hash[:12]} "
                    "but no event precedes it (events removed from the start?)"
                )
        elif event.prev_hash != previous.hash:
            problems.append(
                f"event {event.id}: broken link: it follows {(event.prev_hash or '-')[:12]} "
                f"but the event before it, {previous.id}, is {(previous.hash or '-')[:12]} "
                "(events removed, inserted or reordered between them?)"
            )
        previous = event
    return ChainCheck(
        events=count, head=previous.hash if previous else None, problems=tuple(problems)
    )


def verify_chain(events: Iterable[ChainedEvent]) -> list[str]:
    """Every problem with the chain, one line each naming the event; empty when intact."""
    return list(check_chain(events).problems)
