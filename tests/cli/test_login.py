"""`orbit login URL` never takes the token from argv, where shell history and `ps` keep it: it
reads a file, stdin (`--token-file -`), ORBIT_TOKEN, or a hidden prompt on a terminal. Real CLI
processes against a real `orbit server`; the prompt on a real pseudo-terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import subprocess
import sys
import termios
import time
from pathlib import Path

from tests.orbit_server import Server

POINTER = "give it by --token-file PATH, --token-file - (stdin), ORBIT_TOKEN, or the hidden prompt"


def laptop(server: Server, tmp_path: Path, **more: str) -> dict[str, str]:
    """A user's environment with no server and no token chosen yet."""
    env = {k: v for k, v in server.env().items() if k not in ("ORBIT_SERVER", "ORBIT_TOKEN")}
    return {**env, "ORBIT_HOME": str(tmp_path / "laptop"), **more}


def login(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orbit", "login", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_token_in_argv_is_refused_and_the_other_ways_log_in(
    orbit_server: Server, tmp_path: Path
) -> None:
    env = laptop(orbit_server, tmp_path)
    saved = tmp_path / "laptop" / "credentials.json"
    token = orbit_server.admin_token

    argv = login(env, orbit_server.url, "--token", token)
    assert argv.returncode == 2, argv
    assert argv.stdout == "" and argv.stderr.count("\n") == 1, argv
    assert POINTER in argv.stderr and token not in argv.stderr
    assert not saved.exists()

    nothing = login(env, orbit_server.url)  # no terminal, no file, no ORBIT_TOKEN: no prompt
    assert nothing.returncode == 2 and POINTER in nothing.stderr, nothing
    assert not saved.exists()

    wrong = login(env, orbit_server.url, "--token-file", "-", stdin="orbit_wrong\n")
    assert wrong.returncode == 2 and "not accepted" in wrong.stderr, wrong
    assert not saved.exists()

    for args, stdin, extra in (
        (["--token-file", "-"], f"{token}\n", {}),
        (["--token-file", str(orbit_server.home / "admin-token")], "", {}),
        ([], "", {"ORBIT_TOKEN": token}),
    ):
        saved.unlink(missing_ok=True)
        done = login({**env, **extra}, orbit_server.url, *args, stdin=stdin)
        assert done.returncode == 0, (args, done.stderr)
        assert done.stdout.startswith(f"logged in to {orbit_server.url} as admin (admin)")
        assert token in saved.read_text(encoding="utf-8")


def test_on_a_terminal_the_token_is_asked_for_and_not_echoed(
    orbit_server: Server, tmp_path: Path
) -> None:
    token = orbit_server.admin_token
    shown = on_a_terminal(laptop(orbit_server, tmp_path, NO_COLOR="1"), orbit_server.url, token)
    assert "token: " in shown, shown
    assert token not in shown, shown  # typed, never echoed
    assert f"logged in to {orbit_server.url} as admin (admin)" in shown, shown
    assert token in (tmp_path / "laptop" / "credentials.json").read_text(encoding="utf-8")


def on_a_terminal(env: dict[str, str], url: str, typed: str) -> str:
    """Run `orbit login URL` on a pseudo-terminal of its own, type `typed` at its prompt, and
    return all the terminal showed."""
    leader, follower = pty.openpty()

    def own_terminal() -> None:  # a session whose controlling terminal is the pty
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        [sys.executable, "-m", "orbit", "login", url],
        env=env,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        preexec_fn=own_terminal,
    )
    os.close(follower)
    shown = b""
    deadline = time.monotonic() + 60
    try:
        while b"token: " not in shown and time.monotonic() < deadline:
            shown += _read(leader)
        os.write(leader, typed.encode() + b"\n")
        while proc.poll() is None and time.monotonic() < deadline:
            shown += _read(leader)
        shown += _read(leader)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(leader)
    return shown.decode(errors="replace")


def _read(fd: int) -> bytes:
    ready, _, _ = select.select([fd], [], [], 0.2)
    if not ready:
        return b""
    try:
        return os.read(fd, 4096)
    except OSError:  # the other side closed
        return b""


def test_the_login_is_kept_where_xdg_says_unless_orbit_home_holds_one(
    orbit_server: Server, tmp_path: Path
) -> None:
    """No ORBIT_HOME: the login goes to $XDG_CONFIG_HOME/orbit (else ~/.config/orbit), and
    `orbit whoami` and `logout` find it there; a ~/.orbit that holds one already keeps it."""
    home = tmp_path / "user"
    env = {k: v for k, v in laptop(orbit_server, tmp_path).items() if k != "ORBIT_HOME"}
    env |= {"HOME": str(home), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    token = orbit_server.admin_token
    done = login(env, orbit_server.url, "--token-file", "-", stdin=token)
    assert done.returncode == 0, done.stderr
    xdg = tmp_path / "xdg" / "orbit" / "credentials.json"
    assert token in xdg.read_text(encoding="utf-8") and (xdg.stat().st_mode & 0o777) == 0o600
    assert not (home / ".orbit" / "credentials.json").exists()
    who = subprocess.run(
        [sys.executable, "-m", "orbit", "whoami"], env=env, capture_output=True, text=True
    )
    assert who.stdout.startswith("admin (admin)"), who
    out = subprocess.run(
        [sys.executable, "-m", "orbit", "logout"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0 and not xdg.exists(), out
    # without XDG_CONFIG_HOME: ~/.config/orbit
    plain = {k: v for k, v in env.items() if k != "XDG_CONFIG_HOME"}
    assert login(plain, orbit_server.url, "--token-file", "-", stdin=token).returncode == 0
    assert (home / ".config" / "orbit" / "credentials.json").exists()
    # a login ~/.orbit already holds (saved before) stays the one read and written
    (home / ".config" / "orbit" / "credentials.json").unlink()
    legacy = home / ".orbit" / "credentials.json"
    legacy.parent.mkdir(parents=True, exist_ok=True)
    legacy.write_text('{"server": "http://127.0.0.1:1", "token": "old"}', encoding="utf-8")
    assert login(env, orbit_server.url, "--token-file", "-", stdin=token).returncode == 0
    assert token in legacy.read_text(encoding="utf-8") and not xdg.exists()
