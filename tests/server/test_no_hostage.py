"""Nothing holds a real `orbit server` hostage: many cancels waiting for runs slow to stop leave
/healthz and other users' requests answering at once, and a full disk is reported by /healthz
(503, with the reason) while error answers never show where the server keeps its files."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from orbit import Client
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server

WAITS = 100  # cancels waiting at once
WAIT_S = 10.0  # each waits this long: the runs ignore SIGTERM and are killed after GRACE_S
GRACE_S = 12
QUICK_S = 2.0  # what a quick request may take meanwhile, on a busy test machine


def _slow_to_stop(server: Server, tmp_path: Path, count: int) -> list[str]:
    """Runs on the server's host that ignore SIGTERM: each ends only when killed, GRACE_S
    after it is asked to stop."""
    spec = {
        "experiment": "slow",
        "task_type": "command",
        "template": "local",
        "task": {"command": "trap '' TERM; echo up; sleep 600"},
        "overrides": {"stop_grace_s": GRACE_S},
    }
    with Client(server.url, server.admin_token) as client:
        runs = [client.submit(spec, base_dir=tmp_path) for _ in range(count)]
        for run in runs:
            eventually(lambda run=run: b"up" in b"".join(run.logs()), timeout=60)
    return [run.id for run in runs]


async def _cancel_all(server: Server, runs: list[str]) -> list[httpx.Response]:
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    limits = httpx.Limits(max_connections=WAITS + 10)
    async with httpx.AsyncClient(
        base_url=server.url, headers=headers, limits=limits, timeout=120
    ) as http:
        return await asyncio.gather(
            *(
                http.post(f"/api/v1/runs/{runs[i % len(runs)]}/cancel", json={"wait_s": WAIT_S})
                for i in range(WAITS)
            )
        )


def _timed(http: httpx.Client, path: str) -> tuple[int, float]:
    start = time.monotonic()
    status = http.get(path).status_code
    return status, time.monotonic() - start


def test_a_hundred_cancels_waiting_leave_the_server_answering(
    orbit_server: Server, tmp_path: Path
) -> None:
    runs = _slow_to_stop(orbit_server, tmp_path, 4)
    admin = orbit_server.env()
    orbit(admin, "users", "add", "mia", "--role", "viewer")
    other = orbit_json(admin, "tokens", "create", "--user", "mia")["token"]

    answers: list[httpx.Response] = []
    started = time.monotonic()
    waiting = threading.Thread(
        target=lambda: answers.extend(asyncio.run(_cancel_all(orbit_server, runs)))
    )
    waiting.start()
    try:
        time.sleep(2.0)  # every cancel has been asked, and waits
        assert waiting.is_alive()
        with httpx.Client(base_url=orbit_server.url, timeout=30) as anyone:
            health = _timed(anyone, "/healthz")
        with orbit_server.client(other) as http:
            listed = _timed(http, "/api/v1/runs")
            shown = _timed(http, f"/api/v1/runs/{runs[0]}")
    finally:
        waiting.join(timeout=120)
    assert health[0] == 200 and health[1] < QUICK_S, health
    assert listed[0] == 200 and listed[1] < QUICK_S, listed
    assert shown[0] == 200 and shown[1] < QUICK_S, shown

    # the cancels did wait (the runs were still stopping) and then answered, each of them
    assert len(answers) == WAITS and {a.status_code for a in answers} == {200}
    assert time.monotonic() - started >= WAIT_S
    assert {a.json()["attempts"][-1]["state"] for a in answers} <= {"running", "terminated"}
    with orbit_server.client() as http:

        def ended() -> bool:
            states = [http.get(f"/api/v1/runs/{r}").json()["attempts"][-1]["state"] for r in runs]
            return states == ["terminated"] * len(runs)

        eventually(ended, timeout=GRACE_S + 20)


@pytest.fixture
def small_home(orbit_home: Path) -> Iterator[Path]:
    """The server's ORBIT_HOME on a tmpfs of its own, small enough to fill; unmounted at the
    end (after the servers started on it are stopped: this fixture is set up before them)."""
    size = 96  # MiB: more than /healthz's min_free_disk_mb (64) until it is filled
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}m", "tmpfs", str(orbit_home)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield orbit_home
    finally:
        subprocess.run(["umount", "-l", str(orbit_home)], check=False)


def _fill(folder: Path) -> None:
    """Write until the disk refuses even a page."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1024 * 1024, 4096):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)


def test_a_full_disk_is_unhealthy_and_no_answer_shows_the_servers_paths(
    small_home: Path, start_server: Callable[..., Server], tmp_path: Path
) -> None:
    server = start_server()
    spec = write_spec(tmp_path, task={"command": "echo hi"})
    run_id = orbit_json(server.env(), "submit", str(spec))["id"]
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    with server.client() as http:

        def ended() -> bool:
            attempts = http.get(f"/api/v1/runs/{run_id}").json()["attempts"]
            return bool(attempts[-1]["state"] == "succeeded")

        eventually(ended)

    _fill(small_home)
    health = httpx.get(f"{server.url}/healthz")
    assert health.status_code == 503, health.text
    assert health.headers["content-type"] == "application/problem+json"
    detail = health.json()["detail"]
    assert detail.startswith("store unhealthy: the disk of ORBIT_HOME is full"), detail

    home = str(small_home)
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "data.bin").write_bytes(os.urandom(64 * 1024))
    big = write_spec(tmp_path, "big.yaml", task={"command": "ls", "workdir": "job"})
    submitted = orbit(server.env(), "submit", str(big), check=False)
    assert submitted.returncode != 0
    assert len(submitted.stderr.splitlines()) == 1, submitted.stderr
    assert "Traceback" not in submitted.stderr
    assert home not in submitted.stderr and "orbit-home" not in submitted.stderr, submitted.stderr
    assert submitted.stderr.startswith("orbit: error: the server is out of disk space"), (
        submitted.stderr
    )
    # what is stored is still read: collect streams the one stored copy, it writes nothing
    with server.client() as http:
        collected = http.get(f"/api/v1/runs/{run_id}/artifacts")
    assert collected.status_code == 200, collected.text
    assert b"training.log" in collected.content
