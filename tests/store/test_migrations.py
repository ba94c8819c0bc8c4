"""Migrations: Alembic's own view of the newest revision is the one the fast path trusts."""

from __future__ import annotations

import pytest
from alembic.script import ScriptDirectory

from orbit.store import Store, StoreError
from orbit.store.schema import HEAD_REVISION, alembic_config, current_revision
from tests.store.raw import execute, table_names


def test_head_revision_constant_matches_the_migration_scripts() -> None:
    assert ScriptDirectory.from_config(alembic_config()).get_current_head() == HEAD_REVISION


def test_a_new_store_is_migrated_to_head_with_every_table(store: Store) -> None:
    assert current_revision(store.db) == HEAD_REVISION
    tables = {"experiments", "runs", "attempts", "events", "hosts", "users", "tokens"}
    assert tables | {"alembic_version"} <= table_names(store)


def test_a_store_newer_than_this_orbit_is_refused_in_one_line(store: Store) -> None:
    execute(store, "UPDATE alembic_version SET version_num = :v", v="0099")
    with pytest.raises(StoreError, match=r"revision 0099, newer than this ORBIT knows"):
        Store(store.url)
