"""Run dependencies in the store, on SQLite and PostgreSQL: a held attempt stays out of the
scheduler's queue and of the free-node wake-ups; the end of a run it waits for (and only its
end, not an end that opens an automatic retry) makes it due at once; a hold is refused when the
dependencies ended meanwhile or another process claimed the attempt."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from orbit.model.dependencies import Needed
from orbit.model.models import FailureReason, RunState
from orbit.model.records import RunRecord
from orbit.store import Store
from orbit.store.attempt_leases import wake_waiting_for_nodes
from orbit.store.attempt_states import AutoRetry
from orbit.store.dependencies import Hold
from tests.helpers import a_request, a_submission
from tests.store.test_repository import ACTOR

LATER = timedelta(minutes=5)


def pool_run(store: Store, after: dict[str, list[str]] | None = None) -> RunRecord:
    experiment = store.experiments.find_experiment("pipe") or store.experiments.create_experiment(
        "pipe", ACTOR
    )
    return store.runs.create_run(
        experiment_id=experiment.id,
        task_type="command",
        template_id="pool",
        bundle_digest="d" * 64,
        submission=a_submission(after=after),
        request=a_request("agent_pool_host_process", template_id="pool"),
        actor=ACTOR,
    )


def test_a_held_attempt_is_left_out_until_what_it_waits_for_ends(store: Store) -> None:
    first, other = pool_run(store), pool_run(store)
    then = pool_run(store, {"ok": [first.id], "any": [other.id]})
    assert store.dependencies.of_run(then.id) == [
        Needed(first.id, "ok", RunState.PREPARED),
        Needed(other.id, "any", RunState.PREPARED),
    ]
    now = datetime.now(UTC)
    said = f"waiting for {first.id}"
    assert (
        store.dependencies.hold_attempt(then.current.id, then.id, "me", said, now + LATER)
        is Hold.HELD
    )
    held = store.runs.get_attempt(then.current.id)
    assert held.held == "after" and held.message == said and held.not_before == now + LATER
    # not in the scheduler's queue, and a freed slot wakes the others, never it
    pending = {row["id"] for row in store.scheduling.scheduler_rows(now).pending}
    assert then.current.id not in pending and first.current.id in pending
    with store.db.transaction(write=True) as tx:
        wake_waiting_for_nodes(tx, now, count=10)
    assert store.runs.get_attempt(then.current.id).not_before == now + LATER

    # an end that opens an automatic retry is not the run's end: it stays held
    store.attempts.move_attempt(
        first.current.id,
        RunState.FAILED,
        actor=ACTOR,
        reason=FailureReason.NODE_LOST,
        retry=AutoRetry(not_before=now + LATER),
    )
    assert store.runs.get_attempt(then.current.id).not_before == now + LATER
    assert store.dependencies.of_run(then.id)[0].state is RunState.PREPARED  # its new attempt
    # the run's end makes it due at once
    retried = store.runs.get_run(first.id).current
    store.attempts.move_attempt(retried.id, RunState.SUCCEEDED, actor=ACTOR)
    woken = store.runs.get_attempt(then.current.id)
    assert woken.held == "after" and woken.not_before is not None
    assert woken.not_before <= datetime.now(UTC)
    # held again while `other` runs; once it has ended too, a hold is refused: judge again
    assert (
        store.dependencies.hold_attempt(then.current.id, then.id, "me", said, now + LATER)
        is Hold.HELD
    )
    store.attempts.move_attempt(
        other.current.id, RunState.TERMINATED, actor=ACTOR, reason=FailureReason.CANCELLED
    )
    assert (
        store.dependencies.hold_attempt(then.current.id, then.id, "me", said, now + LATER)
        is Hold.ENDED
    )
    store.dependencies.release_hold(then.current.id)
    released = store.runs.get_attempt(then.current.id)
    assert released.held is None and released.not_before is None and released.message is None
    assert then.current.id in {row["id"] for row in store.scheduling.scheduler_rows(now).pending}


def test_a_hold_never_takes_an_attempt_another_process_claimed_or_that_moved_on(
    store: Store,
) -> None:
    first = pool_run(store)
    then = pool_run(store, {"ok": [first.id]})
    until = datetime.now(UTC) + LATER
    assert store.leases.claim_launch(then.current.id, "other", until, expect=None)
    assert store.dependencies.hold_attempt(then.current.id, then.id, "me", "x", until) is Hold.GONE
    assert (
        store.dependencies.hold_attempt(then.current.id, then.id, "other", "x", until) is Hold.HELD
    )
    assert store.runs.get_attempt(then.current.id).lease_owner is None  # its claim given up
    store.attempts.move_attempt(
        then.current.id, RunState.TERMINATED, actor=ACTOR, reason=FailureReason.CANCELLED
    )
    ended = store.runs.get_attempt(then.current.id)
    assert ended.held is None  # an ended attempt is held by nothing
    assert store.dependencies.hold_attempt(then.current.id, then.id, "me", "x", until) is Hold.GONE
