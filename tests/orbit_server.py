"""A real `orbit server` process on loopback for the tests: `orbit_server` starts one on the
test's store (SQLite or PostgreSQL) and ORBIT home, waits for /healthz, reads the admin token
its first start wrote, and kills it afterwards; `start_server` starts more (replicas, restarts)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    url: str
    home: Path
    database_url: str
    proc: subprocess.Popen[bytes]
    log: Path
    admin_token: str = ""
    extra: list[str] = field(default_factory=list)

    def env(self, token: str | None = None, **more: str) -> dict[str, str]:
        """The environment of a CLI process talking to this server (as admin by default)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
        return {
            **env,
            "ORBIT_HOME": str(self.home),
            "ORBIT_SERVER": self.url,
            "ORBIT_TOKEN": token if token is not None else self.admin_token,
            "COLUMNS": "200",
            **more,
        }

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token or self.admin_token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def launch(
    home: Path,
    database_url: str,
    cwd: Path,
    *args: str,
    port: int | None = None,
    env: dict[str, str] | None = None,
    scheme: str = "http",
    verify: str | bool | Any = True,
    host: str | None = None,
) -> Server:
    """`host`: listen there (`--host`) rather than on 127.0.0.1, and be reached there."""
    port = port or free_port()
    url = f"{scheme}://{host or '127.0.0.1'}:{port}"
    log = home / f"server-{port}-{time.monotonic_ns()}.log"
    home.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k not in ("ORBIT_SERVER", "ORBIT_TOKEN")}
    run_env = {**base, "ORBIT_HOME": str(home), "ORBIT_ACTOR": "orbit-server", **(env or {})}
    cmd = [sys.executable, "-m", "orbit", "server", "--port", str(port)]
    cmd += ["--database-url", database_url, *args]
    if host is not None:
        cmd += ["--host", host]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=run_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = Server(url=url, home=home, database_url=database_url, proc=proc, log=log)
    if isinstance(verify, str):  # a CA file: httpx wants it as a context
        import ssl

        verify = ssl.create_default_context(cafile=verify)
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"orbit server exited {proc.returncode}:\n{server.output()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2, verify=verify).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            server.stop(signal.SIGKILL)
            raise AssertionError(f"orbit server did not answer /healthz:\n{server.output()}")
        time.sleep(0.1)
    token_file = home / "admin-token"
    if token_file.exists():
        server.admin_token = token_file.read_text().strip()
    return server


@pytest.fixture
def start_server(
    orbit_home: Path, store_url: str, tmp_path: Path
) -> Iterator[Callable[..., Server]]:
    """Start `orbit server` processes on the test's store; all are killed at the end."""
    started: list[Server] = []

    def start(*args: str, home: Path | None = None, **kwargs: object) -> Server:
        server = launch(home or orbit_home, store_url, tmp_path, *args, **kwargs)  # type: ignore[arg-type]
        if not server.admin_token and started:
            server.admin_token = started[0].admin_token
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop(signal.SIGKILL)


@pytest.fixture
def orbit_server(start_server: Callable[..., Server]) -> Server:
    return start_server()


@pytest.fixture
def members_here(start_server: Callable[..., Server], tmp_path: Path) -> Server:
    """A server whose own host members may run on too (local_roles), as on a machine one
    would give them a shell on."""
    config = tmp_path / "server.yaml"
    config.write_text(json.dumps({"local_roles": ["admin", "member"]}), encoding="utf-8")
    return start_server("--config", str(config))
