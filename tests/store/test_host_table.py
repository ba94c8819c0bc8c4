"""The hosts registry and the contact records of attempts, on real SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from orbit.model.errors import InvalidInput, NotFound
from orbit.model.hosts import GpuInfo, HostFacts, HostSpec
from orbit.model.models import FailureReason, RunState
from orbit.store import Store
from tests.store.test_repository import ACTOR, make_run

S = RunState


def test_hosts_are_added_found_checked_and_removed_with_an_audit(store: Store) -> None:
    spec = HostSpec(name="h100-a", ssh="root@203.0.113.7", port=2222)
    added = store.hosts.add(spec, None, ACTOR)
    assert added.spec == spec and added.facts is None and added.created_by == ACTOR
    with pytest.raises(InvalidInput, match="host 'h100-a' already exists"):
        store.hosts.add(spec, None, ACTOR)
    facts = HostFacts(
        checked_at=datetime.now(UTC),
        python_path="/usr/bin/python3",
        python_version="3.11.2",
        gpus=(GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", memory_mib=81559),),
        disk_free_bytes=10 << 30,
    )
    checked = store.hosts.set_facts("h100-a", facts, ACTOR)
    assert checked.facts == facts  # a round trip through JSON, GPUs included
    assert [h.name for h in store.hosts.all()] == ["h100-a"]
    store.hosts.remove("h100-a", ACTOR)
    assert store.hosts.find("h100-a") is None
    with pytest.raises(NotFound, match="unknown host 'h100-a'"):
        store.hosts.remove("h100-a", ACTOR)
    actions = [e.action for e in store.audit.list_events()]
    assert actions == ["host.added", "host.checked", "host.removed"]
    assert store.audit.verify_audit() == []


def test_an_unreachable_host_marks_the_attempt_without_changing_its_state(store: Store) -> None:
    experiment = store.experiments.create_experiment("exp", ACTOR)
    run = make_run(store, experiment.id)
    attempt = run.current.id
    store.attempts.move_attempt(attempt, S.SUBMITTED, actor=ACTOR)
    store.attempts.move_attempt(attempt, S.RUNNING, actor=ACTOR)
    assert store.hosts.active_attempts("localhost") == {attempt}
    store.attempts.record_contact(attempt, reachable=True, actor=ACTOR)
    seen = store.runs.get_attempt(attempt).last_contact_at
    assert seen is not None
    for _ in range(2):  # a second miss changes nothing but the message
        store.attempts.record_contact(attempt, reachable=False, actor=ACTOR, message="timed out")
    lost = store.runs.get_attempt(attempt)
    assert lost.state is S.RUNNING and lost.unreachable
    assert lost.reason is FailureReason.HOST_UNREACHABLE and lost.message == "timed out"
    assert lost.last_contact_at == seen and lost.unreachable_since is not None
    store.attempts.record_contact(attempt, reachable=True, actor=ACTOR)
    back = store.runs.get_attempt(attempt)
    assert not back.unreachable and back.reason is None and back.message is None
    actions = [e.action for e in store.audit.list_events() if e.action.startswith("host.")]
    assert actions == ["host.unreachable", "host.reachable"]
    store.attempts.move_attempt(attempt, S.SUCCEEDED, actor=ACTOR)
    assert store.hosts.active_attempts("localhost") == set()
    store.attempts.record_contact(
        attempt, reachable=False, actor=ACTOR, message="gone"
    )  # ended: ignored
    assert store.runs.get_attempt(attempt).reason is None
