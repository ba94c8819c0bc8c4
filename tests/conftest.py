"""Shared fixtures: a private ORBIT home per test, and the store on real SQLite and PostgreSQL.

PostgreSQL is found at ORBIT_TEST_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/
postgres); each test gets a fresh database that is dropped afterwards. Where no server answers
the PostgreSQL cases are skipped, unless ORBIT_REQUIRE_POSTGRES=1 (CI sets it), which fails them.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbit.core.config import Settings
from orbit.core.control.service import CoreControlService
from orbit.core.execution.service import ExecutionService
from orbit.core.execution.ssh.transport import options_for
from orbit.core.tasks import TaskRegistry
from orbit.core.templates import TemplateRegistry, default_search_path
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


@pytest.fixture
def postgres_url() -> Iterator[str]:
    import psycopg

    try:
        admin = _pg_admin()
    except psycopg.OperationalError as exc:
        if os.environ.get("ORBIT_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL is required but does not answer at {PG_ADMIN_URL}: {exc}")
        pytest.skip(f"no PostgreSQL at {PG_ADMIN_URL}")
    name = f"orbit_test_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with _pg_admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same test, once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'orbit.db'}"
    return str(request.getfixturevalue("postgres_url"))


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
