"""Real `orbit agent` processes for the tests, each with its own work dir and identity, joined to
a real `orbit server` (tests/orbit_server.py) with a join token made on the server's store."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from orbit.core.control.service import CoreControlService
from orbit.model.config import Settings
from tests.orbit_server import Server

ROOT = Path(__file__).resolve().parents[1]
NVML_SHIM = ROOT / "tests" / "fakes" / "nvml_shim"
NVML_DATA = ROOT / "tests" / "data" / "nvml"


def with_xids(recording: Path, dest: Path, waits: list[tuple[int, int] | None]) -> Path:
    """`recording` with XID events added, written to `dest`: no GPU fault can be produced here,
    so these events are made up (the source field says so). Each wait on the event set gets the
    next of `waits` in turn, cycling: (GPU index, XID), or None for a timeout."""
    data = json.loads(recording.read_text(encoding="utf-8"))
    xid = 8  # nvmlEventTypeXidCriticalError
    count = next(c["ret"] for c in data["setup"] if c["fn"] == "nvmlDeviceGetCount")
    data["source"] = f"{data['source']} XID events added by the tests (made up): {waits}"
    data["setup"] = [c for c in data["setup"] if not c["fn"].startswith("nvmlEventSet")]
    data["setup"] += [{"fn": "nvmlEventSetCreate", "args": [], "ret": None}]
    data["setup"] += [
        {"fn": "nvmlDeviceRegisterEvents", "args": [i, xid], "ret": None} for i in range(count)
    ]
    for wait in waits:
        call: dict[str, Any] = {"fn": "nvmlEventSetWait", "args": [500]}
        if wait is None:
            call["error"] = 10  # NVML_ERROR_TIMEOUT
        else:
            call["ret"] = {"device": wait[0], "eventType": xid, "eventData": wait[1]}
        data.setdefault("samples", []).append({"calls": [call]})
    dest.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return dest


def nvml_env(recording: Path) -> dict[str, str]:
    """The environment of an agent whose NVML is the replay of `recording` (there is no GPU
    here): its `import pynvml` finds tests/fakes/nvml_shim/pynvml.py first. Pass it as
    `start_agent(..., env=nvml_env(...))`."""
    path = [str(NVML_SHIM), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(path), "ORBIT_NVML_RECORDING": str(recording)}


def control(server: Server) -> CoreControlService:
    """The server's control service, opened on its store in this process (a second replica,
    as far as the store can tell)."""
    return CoreControlService.from_settings(
        Settings(home=server.home, database_url=server.database_url), actor="tests"
    )


def join_token(server: Server, labels: dict[str, str] | None = None) -> str:
    service = control(server)
    try:
        return service.create_join_token(labels or {}).token
    finally:
        service.close()


@dataclass
class AgentProc:
    name: str
    work_dir: Path
    args: list[str]
    env: dict[str, str]
    log: Path
    prefix: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> AgentProc:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*self.prefix, *self.args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Kill the agent only (what it started lives on, as after a crash)."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                self.proc.wait(timeout=20)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def attempts(self) -> list[str]:
        folder = self.work_dir / "attempts"
        return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[Callable[..., AgentProc]]:
    """Start `orbit agent` processes; all are killed at the end, with what they started."""
    started: list[AgentProc] = []

    def start(
        server: Server,
        name: str,
        *,
        labels: str | None = None,
        max_tasks: int = 2,
        token: str | None = None,
        env: dict[str, str] | None = None,
        prefix: list[str] | None = None,
        extra: list[str] | None = None,
        work_dir: Path | None = None,
        task_uids: str = "none",
    ) -> AgentProc:
        """`task_uids`: none (the tasks run as the agent's user: root here, where they can
        write to the test's folders), or FIRST-LAST (each task a user of its own; the work
        dir must then be one those users can pass through, not the test's 0700 tmp_path)."""
        work = work_dir or tmp_path / f"agent-{name}"
        token_file = tmp_path / f"join-{name}.token"
        token_file.write_text(token or join_token(server))
        args = [sys.executable, "-m", "orbit", "agent", "--server", server.url]
        args += ["--name", name, "--work-dir", str(work), "--max-tasks", str(max_tasks)]
        args += ["--join-token-file", str(token_file), "--task-uids", task_uids]
        if labels:
            args += ["--labels", labels]
        args += extra or []
        base = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
        run_env = {**base, "ORBIT_HOME": str(tmp_path / f"home-{name}"), **(env or {})}
        agent = AgentProc(name, work, args, run_env, tmp_path / f"agent-{name}.log")
        agent.prefix = prefix or []
        started.append(agent.start())
        return agent

    yield start
    for agent in started:
        agent.kill()
        _kill_marked(agent.work_dir / "attempts")


def _kill_marked(attempts: Path) -> None:
    """Whatever the agents' attempts left running (their wrappers carry ORBIT_ATTEMPT_ID)."""
    if not attempts.is_dir():
        return
    names = {p.name for p in attempts.iterdir()}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for entry in environ:
            if entry.startswith(b"ORBIT_ATTEMPT_ID=") and entry[17:].decode() in names:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
                break


def wait_online(server: Server, *names: str, timeout: float = 20.0) -> None:
    service = control(server)
    deadline = time.monotonic() + timeout
    try:
        while True:
            have = {n.name for n in service.list_nodes() if n.last_seen_at is not None}
            if set(names) <= have:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"nodes {names} did not join (have {sorted(have)})")
            time.sleep(0.05)
    finally:
        service.close()
