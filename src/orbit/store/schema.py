"""The schema: which revision a store is at, and Alembic's migrations to the newest.

Alembic and SQLAlchemy are imported only when a store is not yet current: a current store costs
one small query here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orbit.store.sql import Database, StoreError, sqlite_path

MIGRATIONS = Path(__file__).parent / "migrations"
# The newest revision in migrations/versions/. A test checks it against Alembic's own view;
# knowing it here spares every CLI call the import of Alembic when the store is current.
HEAD_REVISION = "0004"


def current_revision(db: Database) -> str | None:
    """The store's Alembic revision; None for a new store (no version table yet)."""
    exists = (
        "SELECT to_regclass('alembic_version') IS NOT NULL"
        if db.dialect == "postgresql"
        else "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'"
    )
    with db.transaction(write=False) as tx:
        value = tx.scalar("SELECT version_num FROM alembic_version") if tx.scalar(exists) else None
    return None if value is None else str(value)


def migrate(db: Database) -> None:
    """Upgrade to the newest revision; a store that is already current costs one small query."""
    if current_revision(db) != HEAD_REVISION:
        _upgrade(db.url)


def _upgrade(url: str) -> None:
    from alembic import command
    from sqlalchemy.exc import SQLAlchemyError

    engine = alembic_engine(url)
    config = alembic_config()
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
    except SQLAlchemyError as exc:
        raise StoreError(f"migrating the store failed: {exc}") from exc
    finally:
        engine.dispose()


def alembic_config() -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def alembic_engine(url: str) -> Any:
    """A SQLAlchemy engine for Alembic (and for tests that build an old store): on SQLite with
    the store's pragmas and every transaction a write (BEGIN IMMEDIATE)."""
    from sqlalchemy import create_engine, event

    path = sqlite_path(url)
    if path is None:
        rest = url.partition("://")[2]
        # `postgresql://` means psycopg 3 here; SQLAlchemy would otherwise look for psycopg2
        return create_engine(f"postgresql+psycopg://{rest}", pool_pre_ping=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 30})

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # `_sqlite_begin` opens the transactions
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _sqlite_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine
