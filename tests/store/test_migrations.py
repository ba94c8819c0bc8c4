"""Migrations: Alembic's own view of the newest revision is the one the fast path trusts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from alembic.script import ScriptDirectory

from orbit.model.auth import Role
from orbit.store import Store, StoreError
from orbit.store.schema import HEAD_REVISION, alembic_config, alembic_engine, current_revision
from tests.store.raw import execute, table_names
from tests.store.test_audit_chain import migrate_to
from tests.store.test_repository import ACTOR, make_run


def test_head_revision_constant_matches_the_migration_scripts() -> None:
    assert ScriptDirectory.from_config(alembic_config()).get_current_head() == HEAD_REVISION


@pytest.mark.fresh_database
def test_a_new_store_is_migrated_to_head_with_every_table(store: Store) -> None:
    assert current_revision(store.db) == HEAD_REVISION
    tables = {"experiments", "runs", "attempts", "events", "hosts", "users", "tokens"}
    assert tables | {"alembic_version"} <= table_names(store)


def test_a_store_newer_than_this_orbit_is_refused_in_one_line(store: Store) -> None:
    execute(store, "UPDATE alembic_version SET version_num = :v", v="0099")
    with pytest.raises(StoreError, match=r"revision 0099, newer than this ORBIT knows"):
        Store(store.url)


def test_a_0005_store_gains_users_and_reconcile_leases(store: Store) -> None:
    """Down to 0005 (no users, no leases) and up again: the runs stay, and each attempt that
    has not ended is due its first reconcile."""
    run = make_run(store, store.experiments.create_experiment("exp", ACTOR).id)
    store.users.create_user("root", Role.ADMIN, ACTOR)
    engine = alembic_engine(store.url)
    try:
        migrate_to(engine, "0005", down=True)
        assert not {"users", "tokens"} & table_names(store)
    finally:
        engine.dispose()
    store.close()
    again = Store(store.url)
    try:
        assert current_revision(again.db) == HEAD_REVISION and again.users.count_users() == 0
        assert again.runs.get_run(run.id) == run
        at = datetime.now(UTC)
        claimed = again.leases.claim_reconcile(
            "r", at=at, lease_until=at + timedelta(minutes=1), limit=5
        )
        assert claimed == [(run.id, run.current.id)]
    finally:
        again.close()
