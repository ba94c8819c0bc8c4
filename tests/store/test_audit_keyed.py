"""The keyed audit chain on real SQLite and PostgreSQL, attacked by someone who can write the
database but does not hold the audit key: every hash re-computed after an edit, the last events
deleted (with and without the seal), a chain stripped back to look never keyed (an anchor tells),
a store opened under another key; and a store of unkeyed events that keeps verifying once keying
begins."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from orbit.model.audit_chain import SEAL_BROKEN, Anchor, event_hash, key_id, verify_chain
from orbit.model.audit_key import load_audit_key
from orbit.model.errors import InvalidInput
from orbit.model.records import AuditEvent
from orbit.store import Store
from tests.store.raw import execute, query
from tests.store.test_audit_chain import busy_store, json_param

KEY = bytes(range(32))


@pytest.fixture
def keyed(store_url: str) -> Any:
    store = Store(store_url, audit_key=KEY)
    busy_store(store)
    assert store.audit.verify_audit() == []
    yield store
    store.close()


def rehash_from(store: Store, edited: AuditEvent, **change: Any) -> None:
    """What someone with write access to the database does: change `edited`, then re-compute
    its hash and every later event's hash and link, so the sha256 chain is whole again."""
    events = store.audit.list_events()
    prev = None
    for event in events:
        if event.id == edited.id:
            event = event.model_copy(update=change)
        if event.id >= edited.id:
            digest = event_hash(
                prev_hash=prev,
                at=event.at,
                actor=event.actor,
                action=event.action,
                run_id=event.run_id,
                attempt_id=event.attempt_id,
                data=event.data,
            )
            # hash is unique: park the old one first, so that no two rows meet on the way
            execute(
                store, "UPDATE events SET hash = :h WHERE id = :id", h=f"x{event.id}", id=event.id
            )
            execute(
                store,
                f"UPDATE events SET prev_hash = :p, hash = :h, actor = :a, "
                f"data = {json_param(store)} WHERE id = :id",
                p=prev,
                h=digest,
                a=event.actor,
                d=json.dumps(event.data),
                id=event.id,
            )
            prev = digest
        else:
            prev = event.hash


def test_every_event_of_a_keyed_store_carries_a_mac_and_the_seal_names_the_head(
    keyed: Store,
) -> None:
    events = keyed.audit.list_events()
    assert all(e.mac and len(e.mac) == 64 for e in events)
    check = keyed.audit.check_audit()
    assert (check.keyed_from, check.key_id, check.head) == (
        events[0].id,
        key_id(KEY),
        events[-1].hash,
    )
    [seal] = query(keyed, "SELECT head_id, head_hash FROM audit_seal")
    assert (seal["head_id"], seal["head_hash"]) == (events[-1].id, events[-1].hash)


def test_a_rehashed_chain_fails_under_the_key(keyed: Store) -> None:
    events = keyed.audit.list_events()
    target = events[3]
    rehash_from(keyed, target, actor="mallory")
    assert verify_chain(keyed.audit.list_events()) == []  # sha256 alone is fooled
    problems = keyed.audit.verify_audit()
    assert problems[0] == (
        f"events {target.id} to {events[-1].id}: MAC does not match "
        "(re-hashed by someone without the audit key?)"
    ), problems
    assert any(p.startswith(f"event {events[-1].id}: not the sealed head") for p in problems)

    # and with the MACs removed too: the events are named as unkeyed in a keyed chain
    execute(keyed, "UPDATE events SET mac = NULL WHERE id >= :id", id=target.id)
    problems = keyed.audit.verify_audit()
    assert problems[0].startswith(f"events {target.id} to {events[-1].id}: no MAC in a keyed chain")


def test_a_chain_cut_short_fails_and_the_next_append_does_not_hide_it(keyed: Store) -> None:
    events = keyed.audit.list_events()
    execute(keyed, "DELETE FROM events WHERE id >= :id", id=events[-3].id)
    problems = keyed.audit.verify_audit()
    assert problems == [
        f"the chain ends at event {events[-4].id}, but its seal names event {events[-1].id} "
        f"({events[-1].hash[:12]}) as the last: events were removed from its end"
    ]
    # the next writer finds the seal off the end: it says so in the chain before its own event
    keyed.audit.record_event("alice", "run.note", text="later")
    after = keyed.audit.list_events()
    assert [e.action for e in after[-2:]] == [SEAL_BROKEN, "run.note"]
    assert after[-2].data == {"seal": "behind", "sealed_head": events[-1].id, "last": events[-4].id}
    assert keyed.audit.verify_audit() == [
        f"event {after[-2].id}: the audit seal named event {events[-1].id} as the last, but the "
        f"chain ended at event {events[-4].id} when this event was written: events were removed "
        "or written without the key"
    ]


@pytest.mark.parametrize("how", ["moved", "deleted"])
def test_a_chain_cut_short_with_its_seal_moved_or_deleted_fails(keyed: Store, how: str) -> None:
    events = keyed.audit.list_events()
    execute(keyed, "DELETE FROM events WHERE id >= :id", id=events[-3].id)
    if how == "moved":  # onto the new end: its MAC gives it away
        execute(
            keyed,
            "UPDATE audit_seal SET head_id = :i, head_hash = :h",
            i=events[-4].id,
            h=events[-4].hash,
        )
        assert keyed.audit.verify_audit() == ["the audit seal was altered: its MAC does not match"]
    else:
        execute(keyed, "DELETE FROM audit_seal")
        [problem] = keyed.audit.verify_audit()
        assert problem.startswith(f"the audit seal is missing, though events from {events[0].id}")
    keyed.audit.record_event("alice", "run.note", text="later")
    marker = keyed.audit.list_events()[-2]
    assert marker.action == SEAL_BROKEN
    assert marker.data == {"seal": "altered" if how == "moved" else "missing"}
    [problem] = keyed.audit.verify_audit()
    assert problem.startswith(f"event {marker.id}: the audit seal had been ")


def test_a_chain_stripped_to_look_never_keyed_fails_against_an_anchor(keyed: Store) -> None:
    """Whoever deletes the seal and every MAC leaves a chain that looks as if keying had never
    begun: only something kept outside the database can tell. An anchor does."""
    events = keyed.audit.list_events()
    anchor = Anchor(events[-2].id, events[-2].hash)
    assert keyed.audit.check_audit([anchor]).intact
    execute(keyed, "DELETE FROM audit_seal")
    execute(keyed, "UPDATE events SET mac = NULL")
    rehash_from(keyed, events[2], actor="mallory")
    assert keyed.audit.verify_audit() == []  # nothing in the database says otherwise
    [problem] = keyed.audit.check_audit([anchor]).problems
    assert problem.startswith(f"event {anchor.event}: not the anchored event")

    execute(keyed, "DELETE FROM events WHERE id >= :id", id=events[-3].id)
    [problem] = keyed.audit.check_audit([anchor]).problems
    assert problem.startswith(f"anchored event {anchor.event} ({anchor.hash[:12]}) is past its end")


def test_old_events_keep_verifying_and_keying_begins_with_the_next(store_url: str) -> None:
    plain = Store(store_url)
    busy_store(plain)
    old = plain.audit.list_events()
    plain.close()
    store = Store(store_url, audit_key=KEY)
    try:
        assert store.audit.check_audit().keyed_from is None and store.audit.verify_audit() == []
        store.audit.record_event("alice", "run.note", text="first keyed")
        check = store.audit.check_audit()
        assert check.intact and check.keyed_from == old[-1].id + 1
        assert [e.mac is None for e in store.audit.list_events()] == [True] * len(old) + [False]
        # the old events are checked by the plain rule, as before
        execute(store, "UPDATE events SET actor = 'mallory' WHERE id = :id", id=old[2].id)
        [problem] = store.audit.verify_audit()
        assert problem.startswith(f"event {old[2].id}: content altered")
    finally:
        store.close()


def test_another_key_is_refused_before_anything_is_written(keyed: Store) -> None:
    before = keyed.audit.list_events()
    other = bytes(32)
    with pytest.raises(
        InvalidInput,
        match=rf"keyed under audit key {key_id(KEY)}, and the key given is {key_id(other)}",
    ):
        Store(keyed.url, audit_key=other)
    assert keyed.audit.list_events() == before


def test_the_key_file_is_made_once_for_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "home" / "audit-key"
    key = load_audit_key(path)
    assert len(key) == 32 and load_audit_key(path) == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["audit-key"]  # no temporary left
    path.write_text("not a key\n")
    with pytest.raises(InvalidInput, match=r"not a key ORBIT wrote"):
        load_audit_key(path)
    os.chmod(path, 0)
    if os.geteuid() != 0:  # root reads it all the same
        with pytest.raises(InvalidInput, match=r"Permission denied"):
            load_audit_key(path)


def test_two_keyed_writers_keep_one_sealed_chain(store_url: str) -> None:
    """Two replicas' worth of stores under one key append at the same moment: the seal follows
    every append, so no writer ever finds it off the end, and the chain verifies."""
    writers = [Store(store_url, audit_key=KEY) for _ in range(2)]
    barrier = threading.Barrier(len(writers))
    failures: list[BaseException] = []

    def append(store: Store, name: str) -> None:
        try:
            barrier.wait(timeout=10)
            for i in range(40):
                store.audit.record_event(name, "run.note", i=i)
        except BaseException as exc:  # handed to the main thread
            failures.append(exc)

    try:
        threads = [
            threading.Thread(target=append, args=(s, f"w{i}")) for i, s in enumerate(writers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert failures == []
        events = writers[0].audit.list_events()
        assert len(events) == 80 and SEAL_BROKEN not in {e.action for e in events}
        check = writers[1].audit.check_audit()
        assert check.intact and check.head == events[-1].hash, check.problems
    finally:
        for s in writers:
            s.close()
