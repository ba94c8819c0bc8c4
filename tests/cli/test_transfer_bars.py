"""Transfer bars, as a user sees them: the real CLI against a real `orbit server` and agent.
With standard error on a terminal (a pseudo-terminal here) a submission's inputs going up, a
collect, `nodes push` and `nodes pull` each draw a bar with bytes, rate and time left; on a
pipe, or with --no-progress, standard error carries none of it, and standard output (JSON
here) is the same either way."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import termios
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orbit.core.execution.mirror import read_agent_state
from tests.agents import AgentProc, wait_online
from tests.helpers import ORBIT, eventually, orbit, write_spec
from tests.orbit_server import Server

INPUTS = 4_000_000  # random bytes staged with the run (gzip leaves them about as large)
WEIGHTS = 3_000_000  # what the run writes as its artifact
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def on_terminal(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """`orbit ARGS` with standard error on a pseudo-terminal of 120 columns, standard output
    on a pipe: (exit status, standard output, what the terminal got, escapes removed)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(
        [*ORBIT, *args],
        env={**env, "TERM": "xterm-256color", "COLUMNS": "120"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
    )
    os.close(slave)
    seen: list[bytes] = []

    def drain() -> None:  # the child would block on a full terminal
        while True:
            try:
                block = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end
                return
            if not block:
                return
            seen.append(block)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out, _ = proc.communicate(timeout=120)
    reader.join(timeout=10)
    os.close(master)
    return proc.returncode, out.decode(), ESCAPES.sub("", b"".join(seen).decode(errors="replace"))


def bar(screen: str, what: str, size: str) -> None:
    """`screen` shows the transfer `what` ended: 100%, SIZE/SIZE, a rate and no time left."""
    ended = [line for line in screen.replace("\r", "\n").splitlines() if what in line]
    assert ended, screen
    last = ended[-1]
    assert "100%" in last and f"{size}/{size}" in last, last
    assert re.search(r"\d+(\.\d+)? [kMG]?B/s", last) and "0:00:00" in last, last


def no_bar(stderr: str) -> None:
    assert "\x1b" not in stderr and "\r" not in stderr and "%" not in stderr, stderr


def ended_and_uploaded(server: Server, run_id: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        with server.client() as http:
            run = dict(http.get(f"/api/v1/runs/{run_id}").json())
        last = run["attempts"][-1]
        copy = server.home / "artifacts" / last["id"]
        done = last["state"] in ("succeeded", "failed", "terminated")
        return run if done and read_agent_state(copy).get("complete") else None

    return eventually(check, timeout=60, every=0.1)


def test_transfers_draw_bars_on_a_terminal_and_nothing_on_a_pipe(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    agent = start_agent(orbit_server, "gpu-a")
    wait_online(orbit_server, "gpu-a")
    env = orbit_server.env()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "shard.bin").write_bytes(os.urandom(INPUTS))
    spec = write_spec(
        tmp_path,
        template="pool",
        task={
            "command": f"head -c {WEIGHTS} /dev/urandom > $ORBIT_ARTIFACTS_DIR/weights.bin",
            "workdir": "data",
        },
    )

    # submit: the inputs' bar on the terminal; on a pipe, none
    status, out, screen = on_terminal(env, "submit", str(spec), "--json")
    assert status == 0, screen
    bar(screen, "uploading inputs", "4.0")
    run_id = json.loads(out)["id"]
    piped = orbit(env, "submit", str(spec), "--json")
    no_bar(piped.stderr)
    ended_and_uploaded(orbit_server, json.loads(piped.stdout)["id"])
    ended_and_uploaded(orbit_server, run_id)

    # collect: the artifacts' bar; the same JSON on a pipe, and nothing on its stderr
    status, out, screen = on_terminal(
        env, "collect", run_id, "--dest", str(tmp_path / "a"), "--json"
    )
    assert status == 0, screen
    bar(screen, "collecting artifacts", "3.0")
    on_tty = json.loads(out)
    assert on_tty["verified"] is True and on_tty["moved"] >= WEIGHTS
    piped = orbit(env, "collect", run_id, "--dest", str(tmp_path / "b"), "--json")
    no_bar(piped.stderr)
    assert json.loads(piped.stdout)["moved"] == on_tty["moved"]
    # --no-progress: a terminal gets no bar either
    status, out, screen = on_terminal(
        env, "--no-progress", "collect", run_id, "--dest", str(tmp_path / "c"), "--json"
    )
    assert status == 0 and json.loads(out)["verified"] is True, screen
    assert "collecting" not in screen and "%" not in screen, screen

    # nodes push and pull: a bar each way, and the bytes arrive whole
    payload = os.urandom(WEIGHTS)
    (tmp_path / "w.bin").write_bytes(payload)
    status, out, screen = on_terminal(
        env, "nodes", "push", "gpu-a", str(tmp_path / "w.bin"), "w.bin"
    )
    assert status == 0 and out == f"pushed {WEIGHTS:,} bytes to gpu-a:w.bin\n", screen
    bar(screen, "pushing", "3.0")
    assert (agent.work_dir / "w.bin").read_bytes() == payload
    back = tmp_path / "back.bin"
    status, out, screen = on_terminal(env, "nodes", "pull", "gpu-a", "w.bin", "-o", str(back))
    assert status == 0, screen
    bar(screen, "pulling", "3.0")
    assert back.read_bytes() == payload
    piped = orbit(env, "nodes", "pull", "gpu-a", "w.bin", "-o", str(tmp_path / "again.bin"))
    assert (
        piped.stderr == f"pulled {WEIGHTS:,} bytes from gpu-a:w.bin to {tmp_path / 'again.bin'}\n"
    )
