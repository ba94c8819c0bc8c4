"""The audit trail's hash chain: pure functions, no database.

Every event stores the digest of the event before it (`prev_hash`, none for the very first) and
its own digest (`hash`) over a canonical encoding of its content and that `prev_hash`. Changing
an event's content breaks its own digest; deleting or inserting an event breaks the link of the
one after it. Anyone can check that much from an export, without any key.

A plain digest can be recomputed by whoever can write the database: edit an event, re-hash it
and every event after it, and the chain is whole again; or delete the last events, and a
shorter chain is whole too. So the chain is also keyed:

- Each event written by a store that holds the audit key (orbit.model.audit_key: a file outside
  the database) carries `mac`, an HMAC-SHA256 under that key of its `hash`. The hash covers the
  event and, through `prev_hash`, all before it, so one MAC vouches for the whole prefix; a
  re-hashed event cannot get a matching MAC without the key.
- The store keeps a seal (one row, `Seal`): the first keyed event, the key's id, and the head
  (id and hash of the newest event), under a MAC of its own, rewritten with every append in the
  same transaction. A chain cut short no longer ends at the sealed head; a seal moved back to
  the new end would need the key. The next keyed append that finds the seal deleted, altered
  or off the chain's end does not seal over it: it first appends a SEAL_BROKEN event saying
  what it found, and that event fails every later check.
- Keying starts at the first event a keyed store appends (migration 0010 adds the columns and
  re-hashes nothing): events before the seal's `keyed_from` are checked by the plain rule, as
  they always were, and every event from it on must carry a valid MAC. So one key serves all
  writers of a store: `orbit server` replicas share it (orbit.model.audit_key).
- Anchors (`Anchor`: an event's id and hash, `orbit audit checkpoint`) are kept by an admin
  outside the server. A chain still holding each anchored event with its hash was neither
  re-hashed nor cut before it. They cover what the key cannot: a database rolled back as a
  whole (old seal and all), a chain stripped of its seal and every MAC to look as if keying
  had never begun, and whoever holds the key.

The encodings below are stored formats. Existing chains were hashed with them, so they must
never change; a new encoding would need its own version and a migration that re-chains the store.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from orbit.model.errors import InvalidInput


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


# The event a keyed writer appends before its own where the seal is not as the last keyed
# append left it: deleted, altered, or no longer on the chain's last event (events were cut
# from the end, or written without the key). Re-sealing would hide that; this event keeps it
# in the chain for good, and `check_chain` names it.
SEAL_BROKEN = "audit.seal_broken"


def event_mac(key: bytes, digest: str) -> str:
    """HMAC-SHA256 (hex) under `key` of `orbit-audit-event`, a NUL byte and the event's hash
    (its 64 hex digits, ASCII)."""
    message = b"orbit-audit-event\x00" + digest.encode("ascii")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def key_id(key: bytes) -> str:
    """A key's name that gives nothing of it away: 16 hex digits of HMAC(key, a fixed text)."""
    return hmac.new(key, b"orbit-audit-key-id", hashlib.sha256).hexdigest()[:16]


def seal_mac(key: bytes, keyed_from: int, kid: str, head_id: int, head_hash: str) -> str:
    """HMAC-SHA256 (hex) under `key` of the compact JSON array
    `["orbit-audit-seal", keyed_from, key id, head id, head hash]`."""
    encoded = _json(["orbit-audit-seal", keyed_from, kid, head_id, head_hash])
    return hmac.new(key, encoded.encode("utf-8"), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Seal:
    """The store's one seal row: keyed from which event, under which key, and the head."""

    keyed_from: int
    key_id: str
    head_id: int
    head_hash: str
    mac: str

    @classmethod
    def made(cls, key: bytes, keyed_from: int, head_id: int, head_hash: str) -> Seal:
        kid = key_id(key)
        mac = seal_mac(key, keyed_from, kid, head_id, head_hash)
        return cls(keyed_from, kid, head_id, head_hash, mac)

    def valid(self, key: bytes) -> bool:
        expected = seal_mac(key, self.keyed_from, self.key_id, self.head_id, self.head_hash)
        return hmac.compare_digest(self.mac, expected)


@dataclass(frozen=True)
class Anchor:
    """An event an admin wrote down (`orbit audit checkpoint`): its id and its hash. As text
    (a query parameter): `ID:HASH`."""

    event: int
    hash: str

    def __str__(self) -> str:
        return f"{self.event}:{self.hash}"

    @classmethod
    def parse(cls, text: str) -> Anchor:
        found = re.fullmatch(r"([1-9][0-9]{0,17}):([0-9a-f]{64})", text)
        if found is None:
            raise InvalidInput(f"anchor: expected EVENT_ID:SHA256 (64 hex digits), got {text!r}")
        return cls(int(found.group(1)), found.group(2))


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
    @property
    def mac(self) -> str | None: ...


@dataclass(frozen=True)
class ChainCheck:
    """The outcome of walking a chain: how many events, the last digest, what is wrong, and
    from which event on (under which key) it is keyed; none where it is not."""

    events: int
    head: str | None
    problems: tuple[str, ...]
    keyed_from: int | None = None
    key_id: str | None = None

    @property
    def intact(self) -> bool:
        return not self.problems


def check_chain(
    events: Iterable[ChainedEvent],
    *,
    key: bytes | None = None,
    seal: Seal | None = None,
    anchors: Iterable[Anchor] = (),
) -> ChainCheck:
    """Walk `events` in the order they were written (by id) and name every event whose
    content no longer matches its digest, and every link that does not meet its predecessor.
    With `key`: every MAC from the seal's first keyed event on, and the seal itself. With a
    seal: that the chain ends at its head. With anchors: that each anchored event is there
    with its hash."""
    walk = _Walk(key, seal, {a.event: a.hash for a in anchors})
    for event in events:
        walk.step(event)
    return walk.finish()


def verify_chain(events: Iterable[ChainedEvent]) -> list[str]:
    """Every problem with the chain, one line each naming the event; empty when intact."""
    return list(check_chain(events).problems)


class _Walk:
    """One pass over a chain. Problems are kept with the place in the walk they belong to, so
    that a run of events with the same MAC problem is one line, said where the run began."""

    def __init__(self, key: bytes | None, seal: Seal | None, anchors: Mapping[int, str]) -> None:
        self.key, self.seal, self.anchors = key, seal, dict(anchors)
        self.found: list[tuple[int, str]] = []
        self.count = 0
        self.previous: ChainedEvent | None = None
        self.first_mac: int | None = None
        self.run: tuple[str, int, int, int] | None = None  # kind, walk index, first id, last id
        self.macs = key is not None
        if key is not None and seal is not None:
            if seal.key_id != key_id(key):
                self.macs = False  # every MAC would fail: say why once
                self.found.append((-1, other_key(seal.key_id, key)))
            elif not seal.valid(key):
                self.found.append((-1, "the audit seal was altered: its MAC does not match"))

    def step(self, event: ChainedEvent) -> None:
        self.count += 1
        self._content(event)
        self._link(event)
        if self.macs:
            self._note(self._mac(event), event.id)
        if event.action == SEAL_BROKEN:
            self._say(f"event {event.id}: {seal_broken_line(event.data)}")
        expected = self.anchors.pop(event.id, None)
        if expected is not None and expected != event.hash:
            self._say(
                f"event {event.id}: not the anchored event ({expected[:12]}), it hashes to "
                f"{(event.hash or '-')[:12]} (the chain was rewritten up to here)"
            )
        self.previous = event

    def finish(self) -> ChainCheck:
        self._note(None, 0)
        self._head()
        last = self.previous.id if self.previous else None
        for event_id, digest in sorted(self.anchors.items()):
            where = "past its end" if last is None or event_id > last else "not in it"
            self._say(
                f"anchored event {event_id} ({digest[:12]}) is {where} (the chain ends at "
                f"event {last if last is not None else '-'}): events were removed"
            )
        if self.macs and self.seal is None and self.first_mac is not None:
            self._say(
                f"the audit seal is missing, though events from {self.first_mac} on are keyed: "
                "it was deleted, and events may have been removed from the end with it"
            )
        return ChainCheck(
            events=self.count,
            head=self.previous.hash if self.previous else None,
            problems=tuple(text for _, text in sorted(self.found, key=lambda f: f[0])),
            keyed_from=self.seal.keyed_from if self.seal else None,
            key_id=self.seal.key_id if self.seal else None,
        )

    def _say(self, text: str) -> None:
        self.found.append((self.count, text))

    def _content(self, event: ChainedEvent) -> None:
        if not event.hash:
            self._say(f"event {event.id}: has no hash")
            return
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
            self._say(
                f"event {event.id}: content altered "
                f"(stored hash {event.hash[:12]}, content hashes to {computed[:12]})"
            )

    def _link(self, event: ChainedEvent) -> None:
        previous = self.previous
        if previous is None:
            if event.prev_hash:
                self._say(
                    f"event {event.id}: broken link: it follows {event.prev_hash[:12]} "
                    "but no event precedes it (events removed from the start?)"
                )
        elif event.prev_hash != previous.hash:
            self._say(
                f"event {event.id}: broken link: it follows {(event.prev_hash or '-')[:12]} "
                f"but the event before it, {previous.id}, is {(previous.hash or '-')[:12]} "
                "(events removed, inserted or reordered between them?)"
            )

    def _mac(self, event: ChainedEvent) -> str | None:
        """What is wrong with the event's MAC: `bad`, `missing`, or nothing."""
        assert self.key is not None
        if event.mac:
            if self.first_mac is None:
                self.first_mac = event.id
            expected = event_mac(self.key, event.hash or "")
            return None if hmac.compare_digest(event.mac, expected) else "bad"
        keyed_from = self.seal.keyed_from if self.seal else None
        return "missing" if keyed_from is not None and event.id >= keyed_from else None

    def _note(self, kind: str | None, event_id: int) -> None:
        """Extend the open run of MAC problems, or close it and open the next."""
        if self.run is not None and self.run[0] == kind:
            self.run = (self.run[0], self.run[1], self.run[2], event_id)
            return
        if self.run is not None:
            self.found.append((self.run[1], _mac_problem(*self.run)))
        self.run = (kind, self.count, event_id, event_id) if kind else None

    def _head(self) -> None:
        seal, last = self.seal, self.previous
        if seal is None or (last and (last.id, last.hash) == (seal.head_id, seal.head_hash)):
            return
        sealed = f"event {seal.head_id} ({seal.head_hash[:12]})"
        if last is None or last.id < seal.head_id:
            ends = f"event {last.id}" if last else "no event"
            self._say(
                f"the chain ends at {ends}, but its seal names {sealed} as the last: "
                "events were removed from its end"
            )
        elif last.id > seal.head_id:
            self._say(
                f"the chain goes on past its sealed head, {sealed}: events were added "
                "without the audit key"
            )
        else:
            self._say(f"event {last.id}: not the sealed head {sealed} (re-hashed)")


def _mac_problem(kind: str, _index: int, first: int, last: int) -> str:
    events = f"event {first}" if first == last else f"events {first} to {last}"
    if kind == "bad":
        return f"{events}: MAC does not match (re-hashed by someone without the audit key?)"
    return f"{events}: no MAC in a keyed chain (written without the audit key, or MAC removed)"


def seal_broken_line(data: dict[str, Any]) -> str:
    """What a SEAL_BROKEN event says the next writer found."""
    found = data.get("seal")
    if found == "missing":
        what = "the audit seal had been deleted"
    elif found == "altered":
        what = "the audit seal had been altered"
    else:
        what = (
            f"the audit seal named event {data.get('sealed_head')} as the last, but the chain "
            f"ended at event {data.get('last')}"
        )
    return f"{what} when this event was written: events were removed or written without the key"


def other_key(sealed: str, key: bytes) -> str:
    """The line for a key other than the one a chain is keyed under."""
    return (
        f"the audit chain is keyed under audit key {sealed}, and the key given is {key_id(key)}: "
        "every process that writes to one store needs the same key (ORBIT_AUDIT_KEY_FILE, "
        "default $ORBIT_HOME/audit-key)"
    )
