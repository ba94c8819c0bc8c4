"""The audit trail's hash chain: the pure hash and verifier, then the Store on real SQLite and
PostgreSQL (datetime and JSON round trips, tampering, two concurrent writers, the 0001 -> 0002
migration that backfills the chain)."""

from __future__ import annotations

import itertools
import json
import sqlite3
import threading
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, inspect, text

from orbit.model.audit_chain import canonical_at, check_chain, event_hash, verify_chain
from orbit.model.errors import InvalidInput
from orbit.model.models import RunState
from orbit.model.records import AuditEvent
from orbit.store import Conflict, Store
from orbit.store.audit import append_event
from orbit.store.schema import HEAD_REVISION, alembic_config, alembic_engine, current_revision
from orbit.store.sql import Database
from orbit.store.tables import Base
from tests.helpers import a_request, a_submission
from tests.store.raw import execute, query

ACTOR = "tester"
S = RunState


# --- the pure functions -----------------------------------------------------------------------


def chain(*contents: dict[str, Any]) -> list[AuditEvent]:
    """AuditEvents chained in memory, as the Store would write them."""
    events: list[AuditEvent] = []
    prev: str | None = None
    for i, content in enumerate(contents, start=1):
        fields: dict[str, Any] = {
            "at": datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=i, microseconds=i),
            "actor": "alice",
            "action": "run.note",
            "run_id": None,
            "attempt_id": None,
            "data": {},
            **content,
        }
        digest = event_hash(prev_hash=prev, **fields)
        events.append(AuditEvent(id=i, prev_hash=prev, hash=digest, **fields))
        prev = digest
    return events


def test_event_hash_is_sha256_over_the_documented_encoding() -> None:
    import hashlib

    at = datetime(2026, 11, 20, 9, 30, 1, 250, tzinfo=UTC)
    digest = event_hash(
        prev_hash="ab" * 32,
        at=at,
        actor="alice",
        action="run.created",
        run_id="run-1",
        attempt_id=None,
        data={"b": [1, 2.5], "a": "ü"},
    )
    encoded = (
        '["' + "ab" * 32 + '","2026-11-20T09:30:01.000250Z","alice","run.created","run-1",'
        'null,{"a":"ü","b":[1,2.5]}]'
    )
    assert digest == hashlib.sha256(encoded.encode()).hexdigest()


def test_event_hash_normalises_time_and_key_order_and_keeps_null_apart() -> None:
    base: dict[str, Any] = {
        "prev_hash": None,
        "at": datetime(2026, 1, 1, 12, 0, 0, 5, tzinfo=UTC),
        "actor": "a",
        "action": "x",
        "run_id": None,
        "attempt_id": None,
        "data": {"x": 1, "y": {"b": 2, "a": 1}},
    }
    digest = event_hash(**base)
    # SQLite's naive datetimes are UTC; another zone is the same instant
    assert event_hash(**{**base, "at": base["at"].replace(tzinfo=None)}) == digest
    nepal = timezone(timedelta(hours=5, minutes=45))
    assert event_hash(**{**base, "at": base["at"].astimezone(nepal)}) == digest
    assert canonical_at(base["at"].astimezone(nepal)) == "2026-01-01T12:00:00.000005Z"
    assert event_hash(**{**base, "data": {"y": {"a": 1, "b": 2}, "x": 1}}) == digest
    assert event_hash(**{**base, "prev_hash": ""}) == digest  # the first event: no predecessor
    # every field counts
    assert event_hash(**{**base, "run_id": ""}) != digest
    assert event_hash(**{**base, "at": base["at"] + timedelta(microseconds=1)}) != digest
    assert event_hash(**{**base, "actor": "b"}) != digest
    assert event_hash(**{**base, "prev_hash": "0" * 64}) != digest


def test_verify_chain_names_altered_and_unlinked_events() -> None:
    events = chain({}, {"data": {"n": 1}}, {"run_id": "run-1"}, {"actor": "bob"})
    assert verify_chain(events) == []
    check = check_chain(events)
    assert (check.events, check.head, check.intact) == (4, events[-1].hash, True)
    assert check_chain([]).events == 0 and check_chain([]).intact

    altered = [*events[:1], events[1].model_copy(update={"data": {"n": 2}}), *events[2:]]
    [problem] = verify_chain(altered)
    assert problem.startswith("event 2: content altered")

    [problem] = verify_chain([events[0], *events[2:]])
    assert problem.startswith("event 3: broken link") and "event before it, 1" in problem

    [problem] = verify_chain(events[1:])
    assert problem.startswith("event 2: broken link") and "no event precedes it" in problem

    swapped = verify_chain([events[0], events[2], events[1], events[3]])
    assert [p.split(":")[0] for p in swapped] == ["event 3", "event 2", "event 4"]


# --- the Store, on both databases -------------------------------------------------------------


def busy_store(store: Store) -> None:
    """A few real operations, each writing events."""
    exp = store.experiments.create_experiment("chain", ACTOR)
    run = store.runs.create_run(
        experiment_id=exp.id,
        task_type="command",
        template_id="local",
        bundle_digest="d" * 64,
        submission=a_submission(),
        request=a_request(target="localhost"),
        actor=ACTOR,
    )
    aid = run.current.id
    for to in (S.SUBMITTED, S.RUNNING, S.SUCCEEDED):
        assert store.attempts.move_attempt(
            aid, to, actor=ACTOR, exit_code=0 if to.terminal else None
        )
    store.audit.record_event("alice", "run.note", run_id=run.id, text="héllo ✓", ratio=0.1, n=None)
    store.attempts.request_cancel(aid, "bob")
    with pytest.raises(InvalidInput):  # rolled back, event and all: the chain has no gap
        store.experiments.create_experiment("chain", ACTOR)


def assert_linked(events: list[AuditEvent]) -> None:
    assert [e.id for e in events] == sorted(e.id for e in events)
    assert events[0].prev_hash is None
    for before, after in itertools.pairwise(events):
        assert after.prev_hash == before.hash
    assert len({e.hash for e in events}) == len(events)


def tamper(store: Store, sql: str, **params: Any) -> None:
    assert execute(store, sql, **params) == 1


def json_param(store: Store) -> str:
    return "CAST(:d AS JSON)" if store.dialect == "postgresql" else ":d"


def test_the_chain_is_intact_after_real_operations(store: Store, store_url: str) -> None:
    busy_store(store)
    events = store.audit.list_events()
    assert len(events) == 8
    assert_linked(events)
    assert store.audit.verify_audit() == []
    check = store.audit.check_audit()
    assert (check.events, check.head) == (8, events[-1].hash)
    assert events[6].data == {"text": "héllo ✓", "ratio": 0.1, "n": None}

    # another store (new connections) reads back exactly what was hashed; appends go on
    again = Store(store_url)
    try:
        assert again.audit.verify_audit() == []
        again.audit.record_event("carol", "run.note", data={"tuple": (1, 2)}, at=1.5e-7)
        assert store.audit.verify_audit() == []
        assert store.audit.list_events()[-1].prev_hash == events[-1].hash
    finally:
        again.close()


def test_an_edited_event_is_named(store: Store) -> None:
    busy_store(store)
    events = store.audit.list_events()
    target = events[4]
    tamper(
        store,
        f"UPDATE events SET data = {json_param(store)} WHERE id = :id",
        d=json.dumps({**target.data, "to": "failed"}),
        id=target.id,
    )
    problems = store.audit.verify_audit()
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"event {target.id}: content altered")

    # the other columns are covered too; a forged hash still breaks the next link
    tamper(store, "UPDATE events SET actor = 'mallory' WHERE id = :id", id=events[1].id)
    forged = event_hash(
        prev_hash=target.prev_hash,
        at=target.at,
        actor=target.actor,
        action=target.action,
        run_id=target.run_id,
        attempt_id=target.attempt_id,
        data={**target.data, "to": "failed"},
    )
    tamper(store, "UPDATE events SET hash = :h WHERE id = :id", h=forged, id=target.id)
    problems = store.audit.verify_audit()
    assert [p.split(":")[0] for p in problems] == [f"event {events[1].id}", f"event {events[5].id}"]
    assert "content altered" in problems[0] and "broken link" in problems[1]


def test_a_deleted_event_is_named(store: Store) -> None:
    busy_store(store)
    events = store.audit.list_events()
    tamper(store, "DELETE FROM events WHERE id = :id", id=events[3].id)
    [problem] = store.audit.verify_audit()
    assert problem.startswith(f"event {events[4].id}: broken link")
    assert f"event before it, {events[2].id}" in problem

    tamper(store, "DELETE FROM events WHERE id = :id", id=events[0].id)
    problems = store.audit.verify_audit()
    assert problems[0].startswith(f"event {events[1].id}: broken link")
    assert "no event precedes it" in problems[0]


def test_two_writers_leave_one_unbroken_chain(store_url: str) -> None:
    """Two processes' worth of stores append 50 events each at the same moment: every event
    chains onto a different predecessor, and the chain verifies."""
    setup = Store(store_url)
    writers = [Store(store_url), Store(store_url)]
    barrier = threading.Barrier(len(writers))
    failures: list[BaseException] = []

    def append(store: Store, name: str) -> None:
        try:
            barrier.wait(timeout=10)
            for i in range(50):
                store.audit.record_event(name, "run.note", i=i)
        except BaseException as exc:  # handed to the main thread
            failures.append(exc)

    try:
        setup.audit.record_event(ACTOR, "run.note", first=True)
        threads = [
            threading.Thread(target=append, args=(s, f"writer-{i}")) for i, s in enumerate(writers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert failures == []
        events = setup.audit.list_events()
        assert len(events) == 101
        prevs = [e.prev_hash for e in events]
        assert len(set(prevs)) == len(prevs)  # no two events share a predecessor
        assert_linked(events)
        assert setup.audit.verify_audit() == []
        for name in ("writer-0", "writer-1"):  # each writer's events in its own order
            assert [e.data["i"] for e in events if e.actor == name] == list(range(50))
    finally:
        for s in (setup, *writers):
            s.close()


def test_a_fork_is_refused_by_the_database(store: Store) -> None:
    """Even a writer that skipped the lock could not chain two events onto one predecessor."""
    store.audit.record_event(ACTOR, "run.note")
    [first] = store.audit.list_events()
    columns = "at, actor, action, data, prev_hash, hash"
    values = f":at, 'x', 'run.note', {json_param(store)}, :prev, :h"
    tamper(
        store,
        f"INSERT INTO events ({columns}) VALUES ({values})",
        at=first.at,
        d="{}",
        prev=first.hash,
        h="a" * 64,
    )
    with pytest.raises(Conflict) as refused:
        tamper(
            store,
            f"INSERT INTO events ({columns}) VALUES ({values})",
            at=first.at,
            d="{}",
            prev=first.hash,
            h="b" * 64,
        )
    # the driver's own error, behind the store's
    assert isinstance(
        refused.value.__cause__, sqlite3.IntegrityError | psycopg.errors.UniqueViolation
    )
    assert len(store.audit.list_events()) == 2


@pytest.mark.postgres
def test_a_session_in_another_time_zone_reads_utc_and_hashes_the_same_instant(
    postgres_url: str,
) -> None:
    """PostgreSQL hands timestamptz back in the session's zone: the store reads it as UTC, and
    the hash is over UTC."""
    away = Store(f"{postgres_url}?options=-c%20timezone%3DAsia/Kathmandu")
    home = Store(postgres_url)
    try:
        away.audit.record_event("a", "run.note")
        home.audit.record_event("b", "run.note")
        away.audit.record_event("c", "run.note")
        [session] = query(away, "SELECT current_setting('TimeZone') AS zone, now() AS now")
        assert session["zone"] == "Asia/Kathmandu"  # the session really is elsewhere
        assert session["now"].utcoffset() == timedelta(hours=5, minutes=45)
        events = away.audit.list_events()
        assert [e.at.utcoffset() for e in events] == [timedelta(0)] * 3
        assert away.audit.verify_audit() == [] and home.audit.verify_audit() == []
        assert events == home.audit.list_events()
    finally:
        away.close()
        home.close()


def test_sqlite_writes_begin_immediate_and_reads_do_not_wait(store: Store) -> None:
    """While one write transaction holds the store, a read still answers at once; on SQLite a
    write holds the write lock from its start, a read never takes it, and the pragmas apply to
    every connection."""
    store.audit.record_event(ACTOR, "run.note")
    with store.db.transaction(write=True) as tx:
        append_event(tx, ACTOR, "run.note", held=True)
        assert len(store.audit.list_events()) == 1  # another connection, not waiting for the writer
    assert len(store.audit.list_events()) == 2
    with (
        store.db.transaction(write=False) as tx,
        pytest.raises(RuntimeError, match="only inside a write"),
    ):
        append_event(tx, ACTOR, "run.note")
    assert len(store.audit.list_events()) == 2
    if store.dialect != "sqlite":
        return
    path = store.url.removeprefix("sqlite:///")
    other = sqlite3.connect(path, timeout=0.05, isolation_level=None)
    try:
        # nothing written yet, and still the lock is held
        with (
            store.db.transaction(write=True),
            pytest.raises(sqlite3.OperationalError, match="database is locked"),
        ):
            other.execute("BEGIN IMMEDIATE")
        with store.db.transaction(write=False):  # a read leaves the write lock free
            other.execute("BEGIN IMMEDIATE")
            other.execute("ROLLBACK")
    finally:
        other.close()
    with store.db.transaction(write=False) as tx:
        assert tx.scalar("PRAGMA journal_mode") == "wal"
        assert tx.scalar("PRAGMA busy_timeout") == 30000
        assert tx.scalar("PRAGMA foreign_keys") == 1
    with (
        store.db.transaction(write=True) as tx,
        store.db.transaction(write=False) as nested,
    ):  # a second pooled connection
        assert tx.scalar("PRAGMA busy_timeout") == nested.scalar("PRAGMA busy_timeout") == 30000
        assert nested.scalar("PRAGMA foreign_keys") == 1


# --- the migration ----------------------------------------------------------------------------

OLD_EVENTS = sa.table(  # the events table as revision 0001 wrote it
    "events",
    sa.column("id", sa.Integer),
    sa.column("at", sa.DateTime(timezone=True)),
    sa.column("actor", sa.String),
    sa.column("action", sa.String),
    sa.column("run_id", sa.String),
    sa.column("attempt_id", sa.String),
    sa.column("data", sa.JSON),
)


def migrate_to(engine: Engine, revision: str, *, down: bool = False) -> None:
    config = alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        (command.downgrade if down else command.upgrade)(config, revision)


@pytest.mark.fresh_database
def test_a_0001_store_is_migrated_with_a_backfilled_chain(store_url: str) -> None:
    engine = alembic_engine(store_url)
    try:
        migrate_to(engine, "0001")
        old = Database(store_url)
        assert current_revision(old) == "0001"
        old.close()
        at = datetime(2026, 11, 1, 8, 0, 0, 123456, tzinfo=UTC)
        with engine.begin() as c:
            c.execute(
                OLD_EVENTS.insert(),
                [
                    {
                        "at": at + timedelta(seconds=i),
                        "actor": "old",
                        "action": "run.note",
                        "run_id": "run-1" if i % 2 else None,
                        "attempt_id": None,
                        "data": {"i": i, "text": "ü", "nested": {"b": 1, "a": [1.5]}},
                    }
                    for i in range(5)
                ],
            )
            c.execute(text("DELETE FROM events WHERE id = 2"))  # gaps in ids are fine
    finally:
        engine.dispose()

    store = Store(store_url)
    engine = alembic_engine(store_url)
    try:
        assert current_revision(store.db) == HEAD_REVISION
        events = store.audit.list_events()
        assert [e.id for e in events] == [1, 3, 4, 5]
        assert events[0].at == at
        assert_linked(events)
        assert store.audit.verify_audit() == []
        store.audit.record_event(ACTOR, "run.note", after="migration")
        assert store.audit.list_events()[-1].prev_hash == events[-1].hash
        assert store.audit.verify_audit() == []

        columns = {c["name"]: c for c in inspect(engine).get_columns("events")}
        assert columns["hash"]["nullable"] is False and columns["prev_hash"]["nullable"]
        unique = {
            i["name"]: i["column_names"]
            for i in inspect(engine).get_indexes("events")
            if i["unique"]
        }
        assert unique == {"ix_events_hash": ["hash"], "ix_events_prev_hash": ["prev_hash"]}
        with engine.connect() as c:  # the migrations build what tables.py declares
            assert compare_metadata(MigrationContext.configure(c), Base.metadata) == []

        # down and up again: the chain is rebuilt the same, from the same content
        migrate_to(engine, "0001", down=True)
        assert "hash" not in {c["name"] for c in inspect(engine).get_columns("events")}
        migrate_to(engine, "head")
        assert store.audit.list_events()[:4] == events
        assert store.audit.verify_audit() == []
    finally:
        store.close()
        engine.dispose()
