"""Names read from an embedded store for the shell's completion (orbit.client.names): run and
group ids (the newest first), experiments and nodes, each one query through the store's
driver alone, without a Store (its parts and records cost more than the answer). A SQLite
store that is not there yet offers nothing and is not made."""

from __future__ import annotations

from orbit.store.drivers import driver_for, sqlite_path

QUERIES = {
    "runs": "SELECT id FROM runs ORDER BY created_at DESC LIMIT 500",
    "groups": "SELECT id FROM run_groups ORDER BY created_at DESC LIMIT 500",
    "experiments": "SELECT name FROM experiments ORDER BY name",
    "nodes": "SELECT name FROM nodes ORDER BY name",
}


def stored_names(database_url: str, what: str) -> list[str]:
    """The first column of `what`'s query (one of QUERIES) over the store at the URL."""
    path = sqlite_path(database_url)
    if path is not None and not path.exists():
        return []
    conn = driver_for(database_url).connect()
    try:
        return [str(row[0]) for row in conn.execute(QUERIES[what]).fetchall()]
    finally:
        conn.close()
