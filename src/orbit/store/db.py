"""Opening the store: an engine for the URL, and migrations brought to head before first use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError

MIGRATIONS = Path(__file__).parent / "migrations"
# The newest revision in migrations/versions/. A test checks it against Alembic's own view;
# knowing it here spares every CLI call the import of Alembic when the store is current.
HEAD_REVISION = "0005"
# An execution option: a transaction begun on an engine carrying it is a write transaction. On
# SQLite it begins with BEGIN IMMEDIATE, taking the write lock up front: two writers queue (for
# busy_timeout) instead of both reading and then failing to upgrade, and whatever a writer read
# (the last event's hash, say) is still the newest when it commits. Elsewhere it changes nothing.
WRITE = "orbit_write"


def normalize_url(url: str) -> str:
    """`postgresql://` means psycopg 3 here; SQLAlchemy would otherwise look for psycopg2."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def make_engine(url: str) -> Engine:
    url = normalize_url(url)
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            # the driver must not open transactions of its own: `_sqlite_begin` opens them all
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(connection: Connection) -> None:
            # reads stay DEFERRED: in WAL mode they never wait for a writer, nor writers for them
            immediate = connection.get_execution_options().get(WRITE, False)
            connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine
    return create_engine(url, pool_pre_ping=True)


def current_revision(engine: Engine) -> str | None:
    try:
        with engine.connect() as connection:
            value = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except DBAPIError:  # no version table yet: a new store
        return None
    return None if value is None else str(value)


def alembic_config() -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def migrate(engine: Engine) -> None:
    """Upgrade to the newest revision; a store that is already current costs one small query."""
    if current_revision(engine) == HEAD_REVISION:
        return
    from alembic import command

    config = alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
