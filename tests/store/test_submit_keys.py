"""Submit keys in the store, on SQLite and PostgreSQL: a key is written in the transaction that
creates its run, so a second run with the same user's key is never written (not even by two
writers at once), and a key older than a day is forgotten."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

from orbit.store import Store
from orbit.store.base import utcnow
from orbit.store.submit_keys import KEEP, KeyTaken, SubmitKey
from tests.helpers import a_request, a_submission
from tests.store.raw import execute, query
from tests.store.test_repository import ACTOR


def create(store: Store, experiment_id: str, key: SubmitKey | None) -> str:
    return store.runs.create_run(
        experiment_id=experiment_id,
        task_type="command",
        template_id="local",
        bundle_digest="d" * 64,
        submission=a_submission(),
        request=a_request(target="localhost"),
        actor=ACTOR,
        key=key,
    ).id


def counts(store: Store) -> dict[str, Any]:
    return {
        table: query(store, f"SELECT count(*) AS n FROM {table}")[0]["n"]
        for table in ("runs", "attempts", "events", "submit_keys")
    }


def test_a_key_made_one_run_and_a_second_run_with_it_writes_nothing(store: Store) -> None:
    experiment = store.experiments.create_experiment("exp", ACTOR).id
    key = SubmitKey(user="ann", value="k-1", fingerprint="f" * 64)
    run_id = create(store, experiment, key)
    found = store.submit_keys.find_submit_key("ann", "k-1")
    assert found is not None and (found.run_id, found.fingerprint) == (run_id, "f" * 64)
    before = counts(store)
    with pytest.raises(KeyTaken):
        create(store, experiment, key)
    assert counts(store) == before  # no run, no attempt, no audit event: all rolled back
    # the key is the user's own: another user's same key makes another run
    other = create(store, experiment, SubmitKey(user="bob", value="k-1", fingerprint="e" * 64))
    assert other != run_id and store.submit_keys.find_submit_key("bob", "k-1") is not None
    assert store.submit_keys.find_submit_key("carol", "k-1") is None


def test_writers_racing_with_one_key_make_one_run(store: Store) -> None:
    experiment = store.experiments.create_experiment("exp", ACTOR).id
    key = SubmitKey(user="ann", value="raced", fingerprint="f" * 64)

    def attempt(_: int) -> str | None:
        try:
            return create(store, experiment, key)
        except KeyTaken:
            return None

    with ThreadPoolExecutor(max_workers=8) as pool:
        made = [run for run in pool.map(attempt, range(16)) if run is not None]
    assert len(made) == 1
    assert counts(store)["runs"] == 1 and counts(store)["submit_keys"] == 1
    found = store.submit_keys.find_submit_key("ann", "raced")
    assert found is not None and found.run_id == made[0]


def test_a_key_older_than_a_day_is_forgotten_and_cleared_by_the_next(store: Store) -> None:
    experiment = store.experiments.create_experiment("exp", ACTOR).id
    old = SubmitKey(user="ann", value="old", fingerprint="f" * 64)
    create(store, experiment, old)
    a_day_ago = utcnow() - KEEP - timedelta(minutes=1)
    execute(store, "UPDATE submit_keys SET created_at = :at", at=a_day_ago)
    assert store.submit_keys.find_submit_key("ann", "old") is None
    # the same key again is a new submission now; writing it clears the expired one
    create(store, experiment, old)
    rows = query(store, "SELECT key, run_id FROM submit_keys")
    assert len(rows) == 1 and counts(store)["runs"] == 2
    assert store.submit_keys.find_submit_key("ann", "old") is not None
