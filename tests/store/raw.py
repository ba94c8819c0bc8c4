"""Plain SQL on a store's own database, for tests that look under the Store or tamper with rows
(through the store's SQL layer: `:name` parameters on both databases, a dict is JSON)."""

from __future__ import annotations

from typing import Any

from orbit.store import Store


def execute(store: Store, sql: str, **params: Any) -> int:
    """One statement in its own write transaction; the number of rows it changed."""
    with store.db.transaction(write=True) as tx:
        return tx.execute(sql, params)


def query(store: Store, sql: str, **params: Any) -> list[dict[str, Any]]:
    with store.db.transaction(write=False) as tx:
        return tx.all(sql, params)


def table_names(store: Store) -> set[str]:
    if store.dialect == "sqlite":
        sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
    else:
        sql = (
            "SELECT table_name AS name FROM information_schema.tables WHERE table_schema = 'public'"
        )
    return {row["name"] for row in query(store, sql)}
