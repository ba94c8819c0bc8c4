"""The schema: which revision a store is at, and Alembic's migrations to the newest, run once
at a time however many processes open a new store together.

Alembic and SQLAlchemy are imported only when a store is not yet current: a current store costs
one small query here."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orbit.store.drivers import SqliteDriver, sqlite_path
from orbit.store.sql import Database, StoreError

MIGRATIONS = Path(__file__).parent / "migrations"
# The newest revision in migrations/versions/. A test checks it against Alembic's own view;
# knowing it here spares every CLI call the import of Alembic when the store is current.
HEAD_REVISION = "0020"
# pg_advisory_lock key ("ORBITMIG") held by the one process migrating a PostgreSQL store
MIGRATION_LOCK_KEY = 0x4F524249544D4947


def current_revision(db: Database) -> str | None:
    """The store's Alembic revision; None for a new store (no version table yet)."""
    return _look(db)[0]


def _look(db: Database) -> tuple[str | None, bool]:
    """The revision, and whether the rest of the setup is done (SQLite: in WAL mode)."""
    exists = (
        "SELECT to_regclass('alembic_version') IS NOT NULL"
        if db.dialect == "postgresql"
        else "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'"
    )
    with db.transaction(write=False) as tx:
        value = tx.scalar("SELECT version_num FROM alembic_version") if tx.scalar(exists) else None
        ready = db.dialect != "sqlite" or str(tx.scalar("PRAGMA journal_mode")).lower() == "wal"
    return (None if value is None else str(value)), ready


def migrate(db: Database) -> None:
    """Bring the store to HEAD_REVISION (and a SQLite file to WAL mode). Processes that start
    together on a new store take turns (a file lock beside the SQLite file, a session advisory
    lock on PostgreSQL); each looks again once it holds the lock, so only the first one
    migrates."""
    if _look(db) == (HEAD_REVISION, True):
        return
    with _migration_lock(db):
        revision, ready = _look(db)
        if not ready and isinstance(db.driver, SqliteDriver):
            db.driver.enable_wal()
        if revision is not None and revision.isdigit() and int(revision) > int(HEAD_REVISION):
            raise StoreError(
                f"the store's schema is at revision {revision}, newer than this ORBIT knows "
                f"({HEAD_REVISION}): upgrade ORBIT (a newer version has used this store)"
            )
        if revision != HEAD_REVISION:
            _upgrade(db.url)


@contextmanager
def _migration_lock(db: Database) -> Iterator[None]:
    path = sqlite_path(db.url)
    if path is not None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock
        return
    conn = db.connect()
    try:
        conn.autocommit = True  # a session lock, held across the migration's own transaction
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        yield
    finally:
        conn.close()  # ends the session, and with it the lock


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
