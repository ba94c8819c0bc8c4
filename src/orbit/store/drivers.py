"""What differs between the store's two databases, SQLite (the standard library's sqlite3)
and PostgreSQL (psycopg 3): connecting, beginning a transaction, how values are written, and
the errors (an integrity error is a Conflict). orbit.store.sql runs transactions on them.

Values keep the formats SQLAlchemy gave existing stores: on SQLite a datetime is UTC text
`2026-11-23 08:24:27.123456` and JSON is text; on PostgreSQL they are `timestamp with time zone`
and `json`. SQL is written once, with `:name` parameters; psycopg gets them as `%(name)s`."""

from __future__ import annotations

import functools
import json
import re
import sqlite3
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from orbit.model.errors import StoreError
from orbit.model.stored import utc

Params = Mapping[str, Any]

BUSY_TIMEOUT_S = 30.0  # how long a SQLite writer waits for its turn


class Conflict(StoreError):
    """A write broke a constraint (a unique name, a second attempt with the same number, a
    foreign key): the drivers' IntegrityError (sqlite3.IntegrityError, psycopg's
    UniqueViolation and the like)."""


def sqlite_path(url: str) -> Path | None:
    """`sqlite:///relative.db` or `sqlite:////abs/orbit.db` -> its path; None for other URLs."""
    if not re.match(r"sqlite(\+\w+)?:", url):
        return None
    found = re.match(r"sqlite(\+\w+)?:///([^?]*)", url)
    path = found.group(2) if found else ""
    if not path or path == ":memory:":
        raise StoreError(f"{url}: give SQLite a file (each connection would see its own memory)")
    return Path(path)


@functools.lru_cache(maxsize=512)
def pyformat(sql: str) -> str:
    """`:name` -> `%(name)s` for psycopg (a literal `%` doubled; `::type` casts left alone)."""
    return re.sub(r"(?<![:\w]):(\w+)", r"%(\1)s", sql.replace("%", "%%"))


class Driver:
    """What differs between the two databases: connecting, beginning, values, errors."""

    dialect: str
    errors: tuple[type[Exception], ...]
    integrity: tuple[type[Exception], ...]

    def connect(self) -> Any:
        raise NotImplementedError

    def begin(self, conn: Any, write: bool) -> None:
        raise NotImplementedError

    def commit(self, conn: Any) -> None:
        conn.commit()

    def rollback(self, conn: Any) -> None:
        conn.rollback()

    def sql(self, text: str) -> str:
        return text

    def encode_time(self, value: datetime) -> Any:
        raise NotImplementedError

    def encode(self, params: Params | None) -> dict[str, Any]:
        """Parameters as the driver takes them: a dict is a JSON column's value."""
        out: dict[str, Any] = {}
        for key, value in (params or {}).items():
            if isinstance(value, datetime):
                value = self.encode_time(value)
            elif isinstance(value, dict):
                value = json.dumps(value)
            out[key] = value
        return out

    def ping(self, conn: Any) -> bool:
        return True

    def translate(self, exc: Exception) -> StoreError:
        kind = Conflict if isinstance(exc, self.integrity) else StoreError
        return kind(str(exc).strip() or type(exc).__name__)


class SqliteDriver(Driver):
    dialect = "sqlite"
    errors = (sqlite3.Error,)
    integrity = (sqlite3.IntegrityError,)

    def __init__(self, path: Path) -> None:
        self.path = path
        self._private = False  # made the owner's only (orbit.model.private) once per process

    def connect(self) -> sqlite3.Connection:
        if not self._private:
            from orbit.model.private import private_store

            private_store(self.path)
            self._private = True
        # isolation_level=None: the driver opens no transactions of its own, `begin` opens all;
        # check_same_thread=False: a pooled connection serves one thread at a time, any thread
        conn = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA foreign_keys=ON")
        except BaseException:
            conn.close()
            raise
        return conn

    def enable_wal(self, deadline_s: float = 30.0) -> None:
        """Put the database file in WAL mode (it stays so): readers never wait for the writer.
        The switch needs the file to itself and SQLite answers "locked" at once rather than
        waiting for busy_timeout, so it is tried again while others finish their reads."""
        conn = self.connect()
        try:
            deadline = time.monotonic() + deadline_s
            while True:
                try:
                    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
                    continue
                if str(mode).lower() != "wal":
                    raise StoreError(f"{self.path}: SQLite refused WAL mode (it says {mode})")
                return
        finally:
            conn.close()

    def begin(self, conn: sqlite3.Connection, write: bool) -> None:
        # A write takes the write lock up front: two writers queue (for busy_timeout) instead of
        # both reading and then failing to upgrade, and whatever a writer read (the last event's
        # hash, say) is still the newest when it commits. Reads stay DEFERRED: in WAL mode they
        # never wait for a writer, nor writers for them.
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")

    def commit(self, conn: sqlite3.Connection) -> None:
        conn.execute("COMMIT")

    def rollback(self, conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            conn.execute("ROLLBACK")

    def encode_time(self, value: datetime) -> str:
        return utc(value).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


class PostgresDriver(Driver):
    dialect = "postgresql"

    def __init__(self, conninfo: str) -> None:
        import psycopg  # only for PostgreSQL URLs: it costs an import of its own

        self._psycopg = psycopg
        self.conninfo = conninfo
        self.errors = (psycopg.Error,)
        self.integrity = (psycopg.IntegrityError,)  # UniqueViolation, ForeignKeyViolation, ...

    def connect(self) -> Any:
        return self._psycopg.connect(self.conninfo)

    def begin(self, conn: Any, write: bool) -> None:
        pass  # psycopg opens the transaction with the first statement

    def sql(self, text: str) -> str:
        return pyformat(text)

    def encode_time(self, value: datetime) -> datetime:
        return utc(value)

    def ping(self, conn: Any) -> bool:
        if conn.closed:
            return False
        try:
            conn.execute("SELECT 1")
            conn.rollback()
        except self._psycopg.Error:
            return False
        return True


def driver_for(url: str) -> Driver:
    path = sqlite_path(url)
    if path is not None:
        return SqliteDriver(path)
    scheme, sep, rest = url.partition("://")
    if sep and scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        return PostgresDriver(f"postgresql://{rest}")
    raise StoreError(f"{url}: not a store URL (sqlite:///path or postgresql://...)")
