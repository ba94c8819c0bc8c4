"""`orbit audit`, `orbit audit verify` and `orbit audit export` as a user runs them: a real
process, its exit code, stdout and stderr, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbit.model.audit_chain import verify_chain
from orbit.model.audit_key import load_audit_key
from orbit.model.models import RunState
from orbit.model.records import AuditEvent
from orbit.store import Store
from tests.helpers import a_request, a_submission
from tests.orbit_server import Server
from tests.store.raw import execute
from tests.store.test_audit_keyed import rehash_from

ORBIT = [sys.executable, "-m", "orbit"]


@pytest.fixture
def env(orbit_home: Path, store_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "ORBIT_HOME": str(orbit_home),
        "ORBIT_DATABASE_URL": store_url,
        "COLUMNS": "200",
    }


@pytest.fixture
def filled(store_url: str, orbit_home: Path) -> Iterator[tuple[Store, str]]:
    """A store with a run that went through a few states, and the run's id; keyed under the
    audit key the CLI finds in its ORBIT home."""
    store = Store(store_url, audit_key=load_audit_key(orbit_home / "audit-key"))
    exp = store.experiments.create_experiment("audited", "alice")
    run = store.runs.create_run(
        experiment_id=exp.id,
        task_type="command",
        template_id="local",
        bundle_digest="d" * 64,
        submission=a_submission(),
        request=a_request(target="localhost"),
        actor="alice",
    )
    for to in (RunState.SUBMITTED, RunState.RUNNING, RunState.SUCCEEDED):
        store.attempts.move_attempt(run.current.id, to, actor="orbit")
    store.audit.record_event("bob", "run.note", run_id=run.id, text="looks fine ✓")
    yield store, run.id
    store.close()


def orbit(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ORBIT, *args], env=env, capture_output=True, text=True, timeout=60)


def test_verify_passes_then_names_the_tampered_event(
    env: dict[str, str], filled: tuple[Store, str]
) -> None:
    store, _ = filled
    events = store.audit.list_events()
    ok = orbit(env, "audit", "verify")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines() == [
        f"audit chain intact: {len(events)} events",
        f"head: {events[-1].hash}",
        f"keyed from event {events[0].id} (audit key {store.audit.check_audit().key_id})",
    ]

    edited, removed = events[3], events[5]
    assert execute(store, "UPDATE events SET actor = 'mallory' WHERE id = :id", id=edited.id) == 1
    assert execute(store, "DELETE FROM events WHERE id = :id", id=removed.id) == 1
    bad = orbit(env, "audit", "verify")
    assert bad.returncode == 1
    assert bad.stdout == ""
    lines = bad.stderr.splitlines()
    assert len(lines) == 2, bad.stderr
    assert lines[0].startswith(f"event {edited.id}: content altered")
    assert lines[1].startswith(f"event {events[6].id}: broken link")
    as_json = orbit(env, "audit", "verify", "--json")
    assert as_json.returncode == 1
    report = json.loads(as_json.stdout)
    assert report == {
        "intact": False,
        "events": 6,
        "head": events[-1].hash,
        "keyed_from": events[0].id,
        "key_id": store.audit.check_audit().key_id,
        "anchors": 0,
        "problems": lines,
    }


def test_export_round_trips_with_the_hashes(
    env: dict[str, str], filled: tuple[Store, str], tmp_path: Path
) -> None:
    store, run_id = filled
    proc = orbit(env, "audit", "export", "--json")
    assert proc.returncode == 0, proc.stderr
    exported = json.loads(proc.stdout)
    assert [e["id"] for e in exported] == [e.id for e in store.audit.list_events()]
    assert all(len(e["hash"]) == 64 for e in exported)
    assert exported[0]["prev_hash"] is None
    assert [e["prev_hash"] for e in exported[1:]] == [e["hash"] for e in exported[:-1]]
    events = [AuditEvent.model_validate(e) for e in exported]
    assert events == store.audit.list_events()  # nothing lost in the JSON, to the microsecond
    assert verify_chain(events) == []  # checkable away from the store

    out = tmp_path / "audit.json"
    to_file = orbit(env, "audit", "export", "--json", "--out", str(out))
    assert to_file.returncode == 0, to_file.stderr
    assert to_file.stdout.strip() == f"exported {len(events)} events to {out}"
    assert json.loads(out.read_text(encoding="utf-8")) == exported

    # the listing is as it was
    listed = json.loads(orbit(env, "audit", "--run", run_id, "--json").stdout)
    assert [e["action"] for e in listed] == [
        "run.created",
        "attempt.created",
        "attempt.state",
        "attempt.state",
        "attempt.state",
        "run.note",
    ]
    assert listed == [e for e in exported if e["run_id"] == run_id]
    table = orbit(env, "audit", "--limit", "1")
    assert table.returncode == 0, table.stderr
    assert "run.note" in table.stdout and "attempt.state" not in table.stdout


def test_help_explains_the_listing_and_both_commands(orbit_home: Path) -> None:
    env = {**os.environ, "ORBIT_HOME": str(orbit_home), "COLUMNS": "200"}
    proc = orbit(env, "audit", "--help")
    assert proc.returncode == 0, proc.stderr
    for word in ("--run", "--limit", "--json", "verify", "--anchor", "checkpoint", "export"):
        assert word in proc.stdout, word
    assert "audit" in orbit(env, "--help").stdout


# -- attacks by someone who can write the database, but does not hold the audit key ----------


def test_a_rehashed_chain_fails_verify(env: dict[str, str], filled: tuple[Store, str]) -> None:
    store, _ = filled
    events = store.audit.list_events()
    rehash_from(store, events[2], actor="mallory")
    assert verify_chain(store.audit.list_events()) == []  # every sha256 re-computed: whole again
    bad = orbit(env, "audit", "verify")
    assert bad.returncode == 1 and bad.stdout == "", bad
    lines = bad.stderr.splitlines()
    assert lines[0] == (
        f"events {events[2].id} to {events[-1].id}: MAC does not match "
        "(re-hashed by someone without the audit key?)"
    ), lines
    refused = orbit(env, "audit", "checkpoint")  # no anchor is taken of a chain like that
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.splitlines()[-1] == "no checkpoint: the chain does not verify"


def test_a_truncated_chain_fails_verify_and_its_anchor(
    orbit_server: Server, store_url: str, tmp_path: Path
) -> None:
    """Against a real server: an admin's checkpoint, then the last events deleted in the
    database. The seal and the anchor each tell, through the API."""
    env = orbit_server.env()
    for name in ("a", "b", "c"):
        assert orbit(env, "experiments", "create", name).returncode == 0
    taken = orbit(env, "audit", "checkpoint")
    assert taken.returncode == 0, taken.stderr
    checkpoint = json.loads(taken.stdout)
    anchors = tmp_path / "anchors.jsonl"
    anchors.write_text(taken.stdout, encoding="utf-8")
    held = orbit(env, "audit", "verify", "--anchor", str(anchors))
    assert held.returncode == 0, held.stderr
    assert held.stdout.splitlines()[-1] == "anchors hold: 1"

    raw = Store(store_url)
    try:
        events = raw.audit.list_events()
        assert (events[-1].id, events[-1].hash) == (checkpoint["event"], checkpoint["hash"])
        execute(raw, "DELETE FROM events WHERE id >= :id", id=events[-2].id)
    finally:
        raw.close()
    bad = orbit(env, "audit", "verify", "--anchor", str(anchors))
    assert bad.returncode == 1, bad
    assert bad.stderr.splitlines() == [
        f"the chain ends at event {events[-3].id}, but its seal names event {events[-1].id} "
        f"({events[-1].hash[:12]}) as the last: events were removed from its end",
        f"anchored event {events[-1].id} ({events[-1].hash[:12]}) is past its end (the chain "
        f"ends at event {events[-3].id}): events were removed",
    ]
    garbled = tmp_path / "garbled.jsonl"
    garbled.write_text("{}\n", encoding="utf-8")
    refused = orbit(env, "audit", "verify", "--anchor", str(garbled))
    assert refused.returncode == 2
    assert refused.stderr.startswith(f"orbit: error: --anchor: {garbled} line 1: not a checkpoint")


def test_a_store_opened_with_another_key_is_refused_in_one_line(
    env: dict[str, str], filled: tuple[Store, str], tmp_path: Path
) -> None:
    store, _ = filled
    before = store.audit.list_events()
    other = {**env, "ORBIT_AUDIT_KEY_FILE": str(tmp_path / "another-key")}
    refused = orbit(other, "runs", "list")
    assert refused.returncode == 2 and refused.stdout == "", refused
    [line] = refused.stderr.splitlines()
    assert line.startswith(
        f"orbit: error: the audit chain is keyed under audit key {store.audit.check_audit().key_id}"
    )
    assert store.audit.list_events() == before  # nothing written under the wrong key
