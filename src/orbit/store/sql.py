"""The store's SQL layer: read and write transactions on a small pool of connections for a
URL (each driver's own: orbit.store.drivers), and the helpers its queries use.

The store speaks plain SQL through the drivers themselves (the standard library's sqlite3,
psycopg 3 for PostgreSQL): importing SQLAlchemy costs more than a whole `orbit runs list` may
take, so only migrations use it (see orbit.store.schema). SQL is written once, with `:name`
parameters. Every datetime read back is timezone-aware UTC, whatever the session's zone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from orbit.model.errors import StoreError as StoreError
from orbit.model.stored import read_json as read_json
from orbit.model.stored import read_time as read_time
from orbit.model.stored import read_time_required as read_time_required
from orbit.store.drivers import BUSY_TIMEOUT_S, Driver, Params, driver_for

Row = dict[str, Any]

IDLE_CONNECTIONS = 4  # kept open per Store for the next transaction; more are closed on return
PING_AFTER_S = 1.0  # a pooled PostgreSQL connection idle this long is pinged before it is used
POOL_WAIT_S = 30.0  # a transaction waits this long for one of the bounded pool's connections
APPLICATION_NAME = "orbit"  # the bounded pool's connections, as pg_stat_activity shows them


def expand(name: str, values: Any) -> tuple[str, dict[str, Any]]:
    """`IN (...)` for a list: `(":name0, :name1", {"name0": a, "name1": b})`."""
    params = {f"{name}{i}": v for i, v in enumerate(values)}
    return ", ".join(f":{key}" for key in params), params


def like_prefix(prefix: str) -> str:
    r"""A LIKE pattern (with ESCAPE '\') that matches `prefix` and nothing wilder."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


def ids_by_prefix(tx: Tx, table: str, prefix: str) -> list[str]:
    """The ids in `table` (a name of ours, never the caller's) that start with `prefix`,
    in order: LIKE finds them by the index, and ignores case on SQLite, so each is checked."""
    rows = tx.all(
        f"SELECT id FROM {table} WHERE id LIKE :pattern ESCAPE '\\' ORDER BY id",
        {"pattern": like_prefix(prefix)},
    )
    return [str(r["id"]) for r in rows if r["id"].startswith(prefix)]


class Tx:
    """One transaction on one connection; statements take `:name` parameters."""

    def __init__(
        self, driver: Driver, conn: Any, write: bool, audit_key: bytes | None = None
    ) -> None:
        self.driver = driver
        self.dialect = driver.dialect
        self.write = write
        self.audit_key = audit_key  # the store's (orbit.store.audit keys the events with it)
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
    workers) and every nested transaction gets a connection of its own. On PostgreSQL with a
    `pool_size` (the server's), psycopg_pool's ConnectionPool holds them instead, never more
    than that many: a transaction waits up to POOL_WAIT_S for one, then fails as the store
    failing (503), rather than the server opening connections without end."""

    def __init__(self, url: str, pool_size: int | None = None) -> None:
        self.url = url
        self.driver = driver_for(url)
        self.dialect = self.driver.dialect
        self.pool_size = pool_size if self.dialect == "postgresql" else None
        self._pool: Any = None  # psycopg_pool.ConnectionPool, made at the first checkout
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
        # the audit key (orbit.model.audit_key) every transaction carries to the audit writer;
        # none: events are appended unkeyed (tools and tests that open a bare Store)
        self.audit_key: bytes | None = None

    def connect(self) -> Any:
        """A new connection of the driver's own, outside the pool (the caller closes it)."""
        try:
            return self.driver.connect()
        except self.driver.errors as exc:
            raise self.driver.translate(exc) from exc

    def _bounded(self) -> Any:
        """The bounded pool (PostgreSQL with a pool_size), made once per generation."""
        with self._lock:
            if self._pool is None:
                from psycopg_pool import ConnectionPool

                self._pool = ConnectionPool(
                    self.driver.conninfo,  # type: ignore[attr-defined]
                    min_size=1,
                    max_size=self.pool_size or 1,
                    timeout=POOL_WAIT_S,
                    check=ConnectionPool.check_connection,  # a connection the server dropped
                    kwargs={"application_name": APPLICATION_NAME},
                    name="orbit-store",
                    open=True,
                )
            return self._pool

    def _checkout(self) -> tuple[Any, int]:
        if self.pool_size is not None:
            pool = self._bounded()
            try:
                return pool.getconn(), self._generation
            except Exception as exc:  # PoolTimeout, or the database refusing to connect
                raise StoreError(
                    f"no free connection to the store in {POOL_WAIT_S:.0f} s (all "
                    f"{self.pool_size} of database_pool_size in use): {exc}"
                ) from exc
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
        if self.pool_size is not None:
            self._give_back(conn)
            return
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
                tx = Tx(self.driver, conn, write, self.audit_key)
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
                if self.pool_size is not None:
                    self._give_back(conn)  # its place in the pool: the pool opens another

    def _give_back(self, conn: Any) -> None:
        """A connection back to the bounded pool (a closed one is dropped and replaced), or
        closed if the pool it came from was closed meanwhile."""
        pool = self._pool
        try:
            if pool is None:
                raise RuntimeError("closed")
            pool.putconn(conn)
        except Exception:  # not this pool's any more (close() made a new one)
            with suppress(Exception):
                conn.close()

    def close(self) -> None:
        """Close the pooled connections. Like SQLAlchemy's `dispose`, which it replaces, this
        does not end the Store: a later transaction opens a new connection."""
        with self._lock:
            self._generation += 1
            pool, self._pool = self._pool, None
            idle, self._idle = self._idle, []
        if pool is not None:
            with suppress(Exception):
                pool.close()
        for conn, _ in idle:
            with suppress(Exception):
                conn.close()
