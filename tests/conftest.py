"""Shared fixtures: a private ORBIT home per test, and the store on real SQLite and PostgreSQL.

PostgreSQL is found at ORBIT_TEST_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/
postgres); each test gets a fresh database that is dropped afterwards. Where no server answers
the PostgreSQL cases are skipped, unless ORBIT_REQUIRE_POSTGRES=1 (CI sets it), which fails them.
"""

from __future__ import annotations

import functools
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbit.core.control.service import CoreControlService
from orbit.core.execution.service import ExecutionService
from orbit.core.execution.ssh.transport import options_for
from orbit.core.tasks import TaskRegistry
from orbit.model.config import Settings
from orbit.model.templates import TemplateRegistry, default_search_path
from orbit.store import Store

pytest_plugins = [
    "tests.sshd",  # real sshd servers for the SSH backend: sshd_factory, sshd_server
    "tests.dockerd",  # a private dockerd for the docker launch mode: dockerd, docker_host
    "tests.slurm",  # a private Slurm of two nodes with 2 fake GPUs each: slurm_cluster, slurm
    "tests.orbit_server",  # a real `orbit server` process: orbit_server, start_server
    "tests.agents",  # real `orbit agent` processes: start_agent
]

PG_ADMIN_URL = os.environ.get(
    "ORBIT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def _pg_admin():  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)


def _pg_url(database: str) -> str:
    return f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{database}"


def _pg_database(template: str | None = None) -> Iterator[str]:
    """A database of its own for one test (a copy of `template`, else empty), dropped after."""
    import psycopg

    try:
        admin = _pg_admin()
    except psycopg.OperationalError as exc:
        if os.environ.get("ORBIT_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL is required but does not answer at {PG_ADMIN_URL}: {exc}")
        pytest.skip(f"no PostgreSQL at {PG_ADMIN_URL}")
    name = f"orbit_test_{uuid.uuid4().hex[:12]}"
    with admin:
        copy = f' TEMPLATE "{template}"' if template else ""
        admin.execute(f'CREATE DATABASE "{name}"{copy}')
    try:
        yield _pg_url(name)
    finally:
        with _pg_admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@functools.cache
def _migrated_template() -> str:
    """A database migrated to head once, for every test (and xdist worker) to copy: a copy
    takes a tenth of migrating afresh. Named by the migrations' digest, so a changed migration
    makes a new one; made under a name of its own, then renamed, so no test copies half of it."""
    import hashlib

    import orbit.store

    folder = Path(orbit.store.__file__).parent
    digest = hashlib.sha256()
    for path in sorted([folder / "schema.py", *(folder / "migrations").rglob("*.py")]):
        digest.update(path.read_bytes())
    name = f"orbit_template_{digest.hexdigest()[:16]}"
    with _pg_admin() as admin:
        admin.execute("SELECT pg_advisory_lock(hashtext(%s))", (name,))
        try:
            found = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if found.fetchone() is None:
                building = f"{name}_building"
                admin.execute(f'DROP DATABASE IF EXISTS "{building}" WITH (FORCE)')
                admin.execute(f'CREATE DATABASE "{building}"')
                Store(_pg_url(building)).close()
                admin.execute(f'ALTER DATABASE "{building}" RENAME TO "{name}"')
        finally:
            admin.execute("SELECT pg_advisory_unlock(hashtext(%s))", (name,))
    return name


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """An empty PostgreSQL database of the test's own."""
    yield from _pg_database()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The same test, once on SQLite and once on PostgreSQL (a copy of a database migrated to
    head, or an empty one for a test marked fresh_database)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'orbit.db'}"
    elif request.node.get_closest_marker("fresh_database"):
        yield from _pg_database()
    else:
        import psycopg

        try:
            template = _migrated_template()
        except psycopg.OperationalError:  # no server: _pg_database says so (skip, or fail)
            template = None
        yield from _pg_database(template)


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = Store(store_url)
    yield s
    s.close()


@pytest.fixture
def orbit_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private $ORBIT_HOME; also the cwd, so ./execution_templates/ is the test's own. Its
    SSH control-socket folder (short, so under /tmp rather than here) goes with it."""
    home = tmp_path / "orbit-home"
    home.mkdir()
    monkeypatch.setenv("ORBIT_HOME", str(home))
    monkeypatch.delenv("ORBIT_DATABASE_URL", raising=False)
    monkeypatch.setenv("ORBIT_ACTOR", "tester")
    monkeypatch.chdir(tmp_path)
    yield home
    control = options_for(Settings(home=home.absolute(), database_url="")).control_dir
    if control is not None:
        shutil.rmtree(control, ignore_errors=True)


@pytest.fixture
def settings(orbit_home: Path, store_url: str) -> Settings:
    return Settings(home=orbit_home, database_url=store_url)


@pytest.fixture
def service(settings: Settings) -> Iterator[CoreControlService]:
    svc = CoreControlService(
        store=Store(settings.database_url),
        execution=ExecutionService.default(settings),
        templates=TemplateRegistry(default_search_path(settings.templates_dir, Path.cwd())),
        tasks=TaskRegistry(),
        bundles_dir=settings.bundles_dir,
        actor="tester",
    )
    yield svc
    svc.close()
