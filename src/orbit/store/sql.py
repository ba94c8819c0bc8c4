"""The store's SQL layer: DB-API connections for a URL, read and write transactions, values.

The store speaks plain SQL through the drivers themselves (the standard library's sqlite3,
psycopg 3 for PostgreSQL): importing SQLAlchemy costs more than a whole `orbit runs list` may
take, so only migrations use it (see orbit.store.schema). SQL is written once, with `:name`
parameters; psycopg gets them as `%(name)s`.

Values keep the formats SQLAlchemy gave existing stores: on SQLite a datetime is UTC text
`2026-11-23 08:24:27.123456` and JSON is text; on PostgreSQL they are `timestamp with time zone`
and `json`. Every datetime read back is timezone-aware UTC, whatever the session's zone.
"""

from __future__ import annotations

import functools
import json
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orbit.core.errors import StoreError as StoreError

Row = dict[str, Any]
Params = Mapping[str, Any]

BUSY_TIMEOUT_S = 30.0  # how long a SQLite writer waits for its turn
IDLE_CONNECTIONS = 4  # kept open per Store for the next transaction; more are closed on return
PING_AFTER_S = 1.0  # a pooled PostgreSQL connection idle this long is pinged before it is used


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


def utc(value: datetime) -> datetime:
    """A naive datetime is UTC (SQLite hands them back without a zone)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def read_time(value: Any) -> datetime | None:
    """A stored datetime, aware and in UTC: SQLite's text (with or without `+00:00`) or
    PostgreSQL's datetime in the session's zone."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime), value
    return utc(value)


def read_time_required(value: Any) -> datetime:
    result = read_time(value)
    assert result is not None
    return result


def read_json(value: Any) -> Any:
    """A JSON column: text on SQLite, already decoded by psycopg on PostgreSQL."""
    return json.loads(value) if isinstance(value, str) else value


def expand(name: str, values: Any) -> tuple[str, dict[str, Any]]:
    """`IN (...)` for a list: `(":name0, :name1", {"name0": a, "name1": b})`."""
    params = {f"{name}{i}": v for i, v in enumerate(values)}
    return ", ".join(f":{key}" for key in params), params


def like_prefix(prefix: str) -> str:
    r"""A LIKE pattern (with ESCAPE '\') that matches `prefix` and nothing wilder."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


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

    def connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
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


class Tx:
    """One transaction on one connection; statements take `:name` parameters."""

    def __init__(self, driver: Driver, conn: Any, write: bool) -> None:
        self.driver = driver
        self.dialect = driver.dialect
        self.write = write
        self._conn = conn

    def _run(self, sql: str, params: Params | None) -> Any:
        try:
            return self._conn.execute(self.driver.sql(sql), self.driver.encode(params))
        except self.driver.errors as exc:
            raise self.driver.translate(exc) from exc

    def execute(self, sql: str, params: Params | None = None) -> int:
        """Run a statement; the number of rows it changed."""
        rowcount: int = self._run(sql, params).rowcount
        return rowcount

    def all(self, sql: str, params: Params | None = None) -> list[Row]:
        cursor = self._run(sql, params)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def one(self, sql: str, params: Params | None = None) -> Row | None:
        cursor = self._run(sql, params)
        row = cursor.fetchone()
        if row is None:
            return None
        return dict(zip([d[0] for d in cursor.description], row, strict=True))

    def scalar(self, sql: str, params: Params | None = None) -> Any:
        row = self._run(sql, params).fetchone()
        return None if row is None else row[0]

    def stream(self, sql: str, params: Params | None = None, batch: int = 1000) -> Iterator[Row]:
        """Rows a batch at a time, for walks over a whole table (a server-side cursor on
        PostgreSQL; sqlite3 steps through its results anyway)."""
        if self.dialect == "postgresql":
            cursor = self._conn.cursor(name="orbit_stream")
        else:
            cursor = self._conn.cursor()
        try:
            cursor.execute(self.driver.sql(sql), self.driver.encode(params))
            names = [d[0] for d in cursor.description]
            while rows := cursor.fetchmany(batch):
                for row in rows:
                    yield dict(zip(names, row, strict=True))
        except self.driver.errors as exc:
            raise self.driver.translate(exc) from exc
        finally:
            with suppress(Exception):
                cursor.close()


class Database:
    """The connections of one Store: a small pool, so that every thread (the HTTP server's
    workers) and every nested transaction gets a connection of its own."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.driver = driver_for(url)
        self.dialect = self.driver.dialect
        self._idle: list[tuple[Any, float]] = []
        self._lock = threading.Lock()
        # close() empties the pool; a connection in use meanwhile is closed when returned
        self._generation = 0
        # SQLite has one writer at a time, and a writer that finds the file locked sleeps in
        # its busy handler (1, 2, 5 ... 100 ms at a time) instead of waiting in line: under
        # many writing threads some sleep far past their turn while others barge in (16
        # threads' create_run: p99 ~600 ms). This process's writers take turns on a lock of
        # its own first, each woken as soon as the one before is done (p99 ~90 ms, and more
        # writes per second); other processes still meet at the file's lock, as before.
        self._writer = threading.RLock() if self.dialect == "sqlite" else None

    def connect(self) -> Any:
        """A new connection of the driver's own, outside the pool (the caller closes it)."""
        try:
            return self.driver.connect()
        except self.driver.errors as exc:
            raise self.driver.translate(exc) from exc

    def _checkout(self) -> tuple[Any, int]:
        while True:
            with self._lock:
                generation = self._generation
                conn, since = self._idle.pop() if self._idle else (None, 0.0)
            if conn is None:
                return self.connect(), generation
            if time.monotonic() - since < PING_AFTER_S or self.driver.ping(conn):
                return conn, generation
            with suppress(Exception):
                conn.close()

    def _checkin(self, conn: Any, generation: int) -> None:
        with self._lock:
            if generation == self._generation and len(self._idle) < IDLE_CONNECTIONS:
                self._idle.append((conn, time.monotonic()))
                return
        with suppress(Exception):
            conn.close()

    @contextmanager
    def transaction(self, *, write: bool) -> Iterator[Tx]:
        """Committed when the block ends, rolled back when it raises."""
        if write and self._writer is not None:
            if not self._writer.acquire(timeout=BUSY_TIMEOUT_S):
                raise StoreError(f"database is locked: no turn to write in {BUSY_TIMEOUT_S:.0f} s")
            try:
                with self._transaction(write=True) as tx:
                    yield tx
            finally:
                self._writer.release()
            return
        with self._transaction(write=write) as tx:
            yield tx

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[Tx]:
        conn, generation = self._checkout()
        usable = False
        try:
            try:
                self.driver.begin(conn, write)
                tx = Tx(self.driver, conn, write)
                try:
                    yield tx
                finally:
                    tx._conn = None  # a Tx kept past its block must not reach the next user
                self.driver.commit(conn)
                usable = True
            except self.driver.errors as exc:
                raise self.driver.translate(exc) from exc
        finally:
            if not usable:
                try:
                    self.driver.rollback(conn)
                    usable = True
                except Exception:  # a broken connection: closed below, not pooled
                    pass
            if usable:
                self._checkin(conn, generation)
            else:
                with suppress(Exception):
                    conn.close()

    def close(self) -> None:
        """Close the pooled connections. Like SQLAlchemy's `dispose`, which it replaces, this
        does not end the Store: a later transaction opens a new connection."""
        with self._lock:
            self._generation += 1
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            with suppress(Exception):
                conn.close()
