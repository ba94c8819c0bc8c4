"""Opening the store: an engine for the URL, and migrations brought to head before first use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError

MIGRATIONS = Path(__file__).parent / "migrations"
# The newest revision in migrations/versions/. A test checks it against Alembic's own view;
# knowing it here spares every CLI call the import of Alembic when the store is current.
HEAD_REVISION = "0001"


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
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

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
