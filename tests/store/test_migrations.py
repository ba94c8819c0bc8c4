"""Migrations: Alembic's own view of the newest revision is the one the fast path trusts."""

from __future__ import annotations

from alembic.script import ScriptDirectory

from orbit.store import Store
from orbit.store.schema import HEAD_REVISION, alembic_config, current_revision
from tests.store.raw import table_names


def test_head_revision_constant_matches_the_migration_scripts() -> None:
    assert ScriptDirectory.from_config(alembic_config()).get_current_head() == HEAD_REVISION


def test_a_new_store_is_migrated_to_head_with_every_table(store: Store) -> None:
    assert current_revision(store.db) == HEAD_REVISION
    tables = table_names(store)
    assert {"experiments", "runs", "attempts", "events", "hosts", "alembic_version"} <= tables
