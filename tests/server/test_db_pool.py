"""The server's PostgreSQL connections are bounded: a real `orbit server` on real PostgreSQL with
`database_pool_size: 3` answers 60 requests from 30 threads at once, and pg_stat_activity,
sampled all the while, never shows it holding more than 3 connections. A size the config does
not allow is refused in one line before the server starts."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from orbit.store.sql import APPLICATION_NAME
from tests.orbit_server import Server

SIZE = 3


def held(url: str) -> int:
    """The server's connections to this test's database now (pg_stat_activity)."""
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            (APPLICATION_NAME,),
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_the_server_never_holds_more_connections_than_its_pool_size(
    start_server: Callable[..., Server], store_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(json.dumps({"database_pool_size": SIZE}), encoding="utf-8")
    server = start_server("--config", str(config))
    most, stop = 0, threading.Event()

    def watch() -> None:
        nonlocal most
        while not stop.is_set():
            most = max(most, held(store_url))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    def ask(i: int) -> int:
        with server.client() as http:
            path = ("/api/v1/runs", "/api/v1/whoami", "/api/v1/queue", "/api/v1/nodes")[i % 4]
            return http.get(path).status_code

    with ThreadPoolExecutor(30) as pool:
        answers = list(pool.map(ask, range(60)))
    stop.set()
    watcher.join()
    assert answers == [200] * 60
    assert 1 <= most <= SIZE, f"the server held {most} connections at once"


def test_a_pool_size_out_of_bounds_is_refused_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text("database_pool_size: 1\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "orbit", "server", "--config", str(config), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"ORBIT_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "database_pool_size" in lines[0], done.stderr
