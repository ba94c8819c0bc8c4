"""`--watch` and `logs --tail`, through the CLI as a process: on a pipe a watch appends each
view that changed and never writes a control sequence, and `status --watch` stops once the run
has ended; on a terminal (a pseudo-terminal here) each view is redrawn in place and Ctrl-C
ends it with exit 0; `--tail N` prints the last N lines of what is there. Embedded and against
a server."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.helpers import ORBIT, orbit, orbit_json, sqlite_env, write_spec
from tests.orbit_server import Server


def check_watch_on_a_pipe_and_tail(env: dict[str, str], folder: Path) -> None:
    # the task says when it wrote its last lines, five seconds after the first ones
    spec = write_spec(
        folder, task={"command": "seq 1 100; sleep 5; date -u +%Y-%m-%dT%H:%M:%S.%6NZ; echo done"}
    )
    run_id = orbit_json(env, "submit", str(spec))["id"]
    watched = orbit(env, "status", run_id, "--watch", "--interval", "0.3", timeout=60)
    assert "\x1b" not in watched.stdout and "\x1b" not in watched.stderr
    views = watched.stdout.strip().split("\n\n")
    assert "succeeded" in views[-1] and "succeeded" not in views[0], views
    assert len(views) == len(set(views))  # a view is appended only when it changed
    *_, hundred, stamp, done = orbit(env, "logs", run_id, "--tail", "3").stdout.splitlines()
    assert (hundred, done) == ("100", "done")
    assert orbit(env, "logs", run_id, "--tail", "0").stdout == ""
    assert orbit(env, "logs", run_id, "-n", "500").stdout.splitlines()[0] == "1"
    assert orbit(env, "logs", run_id, "--tail", "2", "--follow").stdout == f"{stamp}\ndone\n"
    # --since: what was written after a time (here two seconds before the task's last lines,
    # three after its first ones), alone, with --tail, in the runtime log, and as a duration
    wrote = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    since = (wrote - timedelta(seconds=2)).isoformat()
    assert orbit(env, "logs", run_id, "--since", since).stdout == f"{stamp}\ndone\n"
    assert orbit(env, "logs", run_id, "--since", since, "-n", "1").stdout == "done\n"
    runtime = orbit(env, "logs", run_id, "--layer", "runtime", "--since", since).stdout
    assert "task exited with 0" in runtime and "starting task" not in runtime, runtime
    assert orbit(env, "logs", run_id, "--since", "1h").stdout.startswith("1\n2\n")
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert orbit(env, "logs", run_id, "--since", later, "--follow").stdout == ""
    bad = orbit(env, "logs", run_id, "--since", "yesterday", check=False)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().count("\n") == 0 and "--since: expected a duration" in bad.stderr


def test_watch_and_tail_embedded(tmp_path: Path) -> None:
    check_watch_on_a_pipe_and_tail(sqlite_env(tmp_path / "home", tmp_path / "o.db"), tmp_path)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_watch_and_tail_against_a_server(orbit_server: Server, tmp_path: Path) -> None:
    check_watch_on_a_pipe_and_tail(orbit_server.env(), tmp_path)


def test_on_a_terminal_a_watch_redraws_in_place_and_ctrl_c_ends_it(tmp_path: Path) -> None:
    env = {**sqlite_env(tmp_path / "home", tmp_path / "o.db"), "TERM": "xterm"}
    orbit_json(env, "submit", str(write_spec(tmp_path)))
    main, sub = pty.openpty()
    proc = subprocess.Popen(
        [*ORBIT, "runs", "list", "--watch", "--interval", "0.3"],
        env=env,
        stdin=sub,
        stdout=sub,
        stderr=sub,
        start_new_session=True,
    )
    os.close(sub)
    seen = b""
    deadline = time.monotonic() + 30
    while seen.count(b"\x1b[H\x1b[2J") < 2 and time.monotonic() < deadline:
        try:
            seen += os.read(main, 65536)
        except OSError:
            break
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    os.close(main)
    assert seen.count(b"\x1b[H\x1b[2J") >= 2, seen[-500:]  # drawn, then drawn again in place
    assert b"RUN" in seen and b"Traceback" not in seen
