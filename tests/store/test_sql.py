"""The store's SQL layer on real SQLite and PostgreSQL: URLs, stored formats (those SQLAlchemy
wrote included), no SQLAlchemy on the normal path, threads sharing one Store, a page of runs,
errors, and eight processes opening a new store at once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from orbit.model.hosts import HostSpec
from orbit.model.models import FailureReason, RunState
from orbit.store import Store, StoreError, sql
from orbit.store.drivers import PostgresDriver, SqliteDriver, driver_for, pyformat
from orbit.store.schema import HEAD_REVISION
from orbit.store.sql import Tx, read_time
from tests.store.raw import execute, query
from tests.store.test_repository import ACTOR, make_run

S = RunState


# --- the pure parts ---------------------------------------------------------------------------


def test_urls_name_a_driver_or_are_refused() -> None:
    for url, path in (
        ("sqlite:///rel/orbit.db", "rel/orbit.db"),
        ("sqlite:////abs/orbit.db", "/abs/orbit.db"),
    ):
        driver = driver_for(url)
        assert isinstance(driver, SqliteDriver) and driver.path == Path(path)
    for url in ("postgresql://u@h/db", "postgresql+psycopg://u@h/db", "postgres://u@h/db"):
        driver = driver_for(url)
        assert isinstance(driver, PostgresDriver) and driver.conninfo == "postgresql://u@h/db"
    for url in ("sqlite://", "sqlite:///:memory:", "mysql://u@h/db", "orbit.db"):
        with pytest.raises(StoreError):
            driver_for(url)


def test_parameters_are_written_once_and_translated_for_psycopg() -> None:
    assert pyformat("SELECT :a, :b_2 WHERE x = :a") == "SELECT %(a)s, %(b_2)s WHERE x = %(a)s"
    assert (
        pyformat("SELECT CAST(:d AS JSON), :d::json") == "SELECT CAST(%(d)s AS JSON), %(d)s::json"
    )
    assert pyformat("SELECT '50%' LIKE :p") == "SELECT '50%%' LIKE %(p)s"
    assert pyformat("SELECT '12:30'") == "SELECT '12:30'"


def test_stored_times_read_back_aware_and_utc() -> None:
    want = datetime(2026, 11, 23, 8, 24, 27, 123456, tzinfo=UTC)
    for stored in (
        "2026-11-23 08:24:27.123456",  # SQLAlchemy's SQLite format
        "2026-11-23 08:24:27.123456+00:00",
        "2026-11-23T10:24:27.123456+02:00",
        datetime(2026, 11, 23, 8, 24, 27, 123456),
        want.astimezone(),
    ):
        got = read_time(stored)
        assert got == want and got.tzinfo is UTC, stored
    assert read_time("2026-11-23 08:24:27") == want.replace(microsecond=0)
    assert read_time(None) is None


# --- stored formats ---------------------------------------------------------------------------


def test_sqlite_keeps_the_formats_sqlalchemy_wrote(tmp_path: Path) -> None:
    """Text datetimes `YYYY-MM-DD HH:MM:SS.ffffff` (UTC, no zone) and JSON as text, as before;
    rows written in either way (and by hand, with a zone or no microseconds) read the same."""
    store = Store(f"sqlite:///{tmp_path / 'orbit.db'}")
    try:
        exp = store.experiments.create_experiment("e", ACTOR)
        run = make_run(store, exp.id)
        store.attempts.move_attempt(
            run.current.id, S.FAILED, actor=ACTOR, reason=FailureReason.NODE_LOST
        )
        [row] = query(store, "SELECT created_at, submission FROM runs")
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}", row["created_at"])
        assert isinstance(row["submission"], str)  # JSON as text
        assert json.loads(row["submission"]) == run.submission.model_dump(mode="json")
        [attempt] = query(store, "SELECT finished_at, handle, cancel_requested FROM attempts")
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}", attempt["finished_at"])
        assert attempt["handle"] is None and attempt["cancel_requested"] == 0

        for stored, want in (
            ("2026-11-23 08:24:27.123456", datetime(2026, 11, 23, 8, 24, 27, 123456, tzinfo=UTC)),
            ("2026-11-23 08:24:27+00:00", datetime(2026, 11, 23, 8, 24, 27, tzinfo=UTC)),
        ):
            execute(store, "UPDATE experiments SET created_at = :at", at=stored)
            assert store.experiments.get_experiment("e").created_at == want
        # SQLAlchemy wrote a None it was given for a JSON column as JSON null
        store.hosts.add(HostSpec(name="h", ssh="root@h"), None, ACTOR)
        assert execute(store, "UPDATE hosts SET facts = 'null'") == 1
        assert execute(store, "UPDATE attempts SET handle = 'null'") == 1
        assert store.hosts.get("h").facts is None
        assert store.runs.get_attempt(run.current.id).handle is None
    finally:
        store.close()


def test_a_time_written_in_another_zone_reads_back_as_the_same_instant(store: Store) -> None:
    exp = store.experiments.create_experiment("e", ACTOR)
    stored = "2026-11-23 10:24:27.5+02:00"
    execute(store, "UPDATE experiments SET created_at = :at WHERE id = :id", at=stored, id=exp.id)
    got = store.experiments.get_experiment(exp.id).created_at
    assert got == datetime(2026, 11, 23, 8, 24, 27, 500000, tzinfo=UTC)
    assert got.tzinfo is UTC


# --- no SQLAlchemy on the normal path ---------------------------------------------------------

EVERYTHING = """
import sys
from orbit.model.hosts import HostSpec
from orbit.model.models import ExecutionRequest, FailureReason, RunState as S, TaskSubmission
from orbit.store import Store

store = Store(sys.argv[1])
exp = store.experiments.create_experiment("fast", "t")
store.experiments.find_experiment("fast"), store.experiments.list_experiments()
run = store.runs.create_run(
    experiment_id=exp.id, task_type="command", template_id="local", bundle_digest="d" * 64,
    actor="t", submission=TaskSubmission(
        experiment_id=exp.id, task_type="command", task_request={}, template_id="local",
    ), request=ExecutionRequest(
        template_id="local", placement={"kind": "local"}, launch_mode={"kind": "host_process"},
        target="h", detach=True, resources={}, runtime_env={}, stop_grace_s=10,
    ),
)
aid = run.current.id
store.attempts.move_attempt(aid, S.SUBMITTED, actor="t")
store.attempts.record_contact(aid, reachable=False, actor="t", message="gone")
store.attempts.record_contact(aid, reachable=True, actor="t")
store.attempts.request_cancel(aid, "t")
store.attempts.move_attempt(aid, S.TERMINATED, actor="t", reason=FailureReason.CANCELLED)
store.runs.add_attempt(run.id, target=None, backend_key="k", trigger="retry", actor="t")
store.runs.get_run(run.id[:9]), store.runs.get_attempt(aid)
store.runs.list_runs(limit=50), store.runs.list_runs(states={S.PREPARED}), store.runs.count_runs()
store.hosts.add(HostSpec(name="h", ssh="root@h"), None, "t")
store.hosts.all(), store.hosts.active_attempts("h")
store.hosts.remove("h", "t")
store.audit.record_event("t", "run.note"), store.audit.list_events(limit=3)
assert store.audit.verify_audit() == []
store.close()
loaded = {m.split(".")[0] for m in sys.modules}
print(" ".join(sorted(loaded & {"sqlalchemy", "alembic", "psycopg"})))
"""


def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )


def test_a_current_store_never_imports_sqlalchemy(store: Store, store_url: str) -> None:
    """Every Store method, in a process of its own, on a store that is current: no SQLAlchemy,
    no Alembic; psycopg only for PostgreSQL."""
    proc = run_python(EVERYTHING, store_url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == (["psycopg"] if store.dialect == "postgresql" else [])


def test_a_new_store_imports_alembic_to_migrate(tmp_path: Path) -> None:
    """The same check on a store that needs migrating: it sees what it is looking for."""
    proc = run_python(EVERYTHING, f"sqlite:///{tmp_path / 'new.db'}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["alembic", "sqlalchemy"]


# --- one Store, many threads ------------------------------------------------------------------


def test_threads_share_one_store(store: Store) -> None:
    """The HTTP server's workers call one Store at once: every transaction its own connection."""
    exp = store.experiments.create_experiment("threads", ACTOR)
    barrier = threading.Barrier(6)
    failures: list[BaseException] = []

    def work() -> None:
        try:
            barrier.wait(timeout=10)
            for _ in range(5):
                run = make_run(store, exp.id)
                assert store.attempts.move_attempt(run.current.id, S.SUBMITTED, actor=ACTOR)
                with store.db.transaction(write=False):  # a read held open while others write
                    assert store.runs.get_run(run.id).state is S.SUBMITTED
                store.runs.list_runs(limit=10)
        except BaseException as exc:  # handed to the main thread
            failures.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert failures == []
    assert store.runs.count_runs(experiment_id=exp.id) == 30
    assert store.runs.count_runs(states={S.SUBMITTED}) == 30
    assert len(store.audit.list_events()) == 1 + 30 * 3
    assert store.audit.verify_audit() == []


# --- reads stay small -------------------------------------------------------------------------


def test_a_page_of_runs_reads_the_attempts_of_that_page_only(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp = store.experiments.create_experiment("e", ACTOR)
    runs = [make_run(store, exp.id) for _ in range(6)]
    seen: list[tuple[str, dict[str, Any]]] = []
    real = Tx._run

    def spy(self: Tx, text: str, params: Any) -> Any:
        seen.append((text, dict(params or {})))
        return real(self, text, params)

    monkeypatch.setattr(Tx, "_run", spy)
    page = store.runs.list_runs(limit=2)
    assert [r.id for r in page] == [runs[-1].id, runs[-2].id]
    assert len(seen) == 2
    assert seen[1][0].startswith("SELECT") and "FROM attempts WHERE run_id IN" in seen[1][0]
    assert seen[1][1] == {"run0": runs[-1].id, "run1": runs[-2].id}

    seen.clear()
    assert store.runs.get_run(runs[0].id) == runs[0]
    assert len(seen) == 3  # the id, the run with its experiment's name, its attempts
    seen.clear()
    assert len(store.runs.list_runs(states={S.PREPARED}, limit=3)) == 3
    assert [p.get("run0") for _, p in seen] == [None, runs[-1].id]
    assert len(seen[1][1]) == 3


# --- errors -----------------------------------------------------------------------------------


def test_a_store_that_cannot_be_reached_is_a_store_error() -> None:
    with pytest.raises(StoreError) as refused:
        Store("postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=3")
    assert isinstance(refused.value.__cause__, psycopg.OperationalError)
    with pytest.raises(StoreError, match="not a store URL"):
        Store("mysql://root@localhost/orbit")


def test_the_cli_says_which_store_failed_in_one_line(orbit_home: Path) -> None:
    url = "postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=3"
    env = {**os.environ, "ORBIT_HOME": str(orbit_home), "ORBIT_DATABASE_URL": url}
    proc = subprocess.run(
        [sys.executable, "-m", "orbit", "experiments", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"orbit: error: the store at {url} failed: ")
    assert "Traceback" not in proc.stderr


@pytest.mark.postgres
def test_a_pooled_connection_the_server_dropped_is_replaced(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(postgres_url)
    try:
        exp = store.experiments.create_experiment("e", ACTOR)
        name = postgres_url.rsplit("/", 1)[1]
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            ).fetchone()
        assert killed is not None and killed[0] >= 1
        monkeypatch.setattr(sql, "PING_AFTER_S", 0.0)  # as if it had been idle a while
        assert store.experiments.get_experiment("e") == exp
    finally:
        store.close()


# --- first use, eight processes at once -------------------------------------------------------

FIRST_USE = """
import sys
from orbit.store import Store

print("ready", flush=True)
sys.stdin.readline()  # all eight go together
store = Store(sys.argv[1])
store.experiments.create_experiment(f"e{sys.argv[2]}", "t")
print(len(store.experiments.list_experiments()))
store.close()
"""


def eight_at_once(url: str) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", FIRST_USE, url, str(i)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(8)
    ]
    try:
        for p in procs:  # every one has paid for its imports
            assert p.stdout is not None and p.stdout.readline() == "ready\n"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    failed = [
        (p.returncode, err) for p, (_, err) in zip(procs, results, strict=True) if p.returncode
    ]
    assert failed == []
    store = Store(url)
    try:
        assert sorted(e.name for e in store.experiments.list_experiments()) == [
            f"e{i}" for i in range(8)
        ]
        assert query(store, "SELECT version_num FROM alembic_version") == [
            {"version_num": HEAD_REVISION}
        ]
        assert store.audit.verify_audit() == []
    finally:
        store.close()


def test_eight_processes_open_a_new_sqlite_store_at_once(tmp_path: Path) -> None:
    eight_at_once(f"sqlite:///{tmp_path / 'home' / 'orbit.db'}")


@pytest.mark.postgres
def test_eight_processes_open_a_new_postgres_store_at_once(postgres_url: str) -> None:
    eight_at_once(postgres_url)


def test_close_ends_the_pooled_connections_and_the_store_still_answers(store: Store) -> None:
    """As SQLAlchemy's `dispose` did: closing is not the end of the Store."""
    exp = store.experiments.create_experiment("e", ACTOR)
    with store.db.transaction(
        write=False
    ) as held:  # in use while the pool is closed: closed when returned
        store.close()
        assert held.scalar("SELECT count(*) FROM experiments") == 1
    assert store.db._idle == []
    assert store.experiments.get_experiment("e") == exp
    assert len(store.db._idle) == 1
