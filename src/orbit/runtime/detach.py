"""How the runtime wrapper starts: its command line, read by hand, the run's secrets read
before anything else (stdin is gone after the fork), and the double fork into a new session
that lets the attempt outlive the shell, the SSH connection or the CLI that started it. It
travels inside the bundle beside the wrapper (scripts/orbit_detach.py) and needs nothing but
python3's standard library.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # as mypy reads it
    from orbit.runtime import sidecars
else:
    try:  # in a bundle: beside this file in scripts/
        import orbit_sidecars as sidecars
    except ImportError:  # as part of the orbit package
        from orbit.runtime import sidecars


def detach(bundle: str) -> int:
    """Double fork into a new session, so the attempt outlives the shell, the SSH connection or
    the CLI that started it. The first process returns once the wrapper has written its pid.
    The pid of that first process (it may still be printing the wrapper's)."""
    runtime = os.path.join(os.path.abspath(bundle), "runtime")
    pid_file = os.path.join(runtime, "pid")
    os.makedirs(runtime, exist_ok=True)
    # A wrapper that already runs keeps its pid file (a cancel needs it): refuse at once.
    with open(os.path.join(runtime, "lock"), "a+", opener=sidecars.nofollow) as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.exit(f"orbit wrapper: {bundle} is already running (runtime/lock is held)")
        if os.path.exists(pid_file):
            os.unlink(pid_file)
    launcher = os.getpid()
    first = os.fork()
    if first > 0:
        os.waitpid(first, 0)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with open(pid_file, encoding="utf-8") as f:
                    pid = f.read().strip()
                if pid:
                    print(pid)
                    sys.exit(0)
            except FileNotFoundError:
                pass
            time.sleep(0.01)
        sys.exit("orbit wrapper: the detached wrapper did not start (see runtime/wrapper.err)")
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    err = sidecars.nofollow(
        os.path.join(runtime, "wrapper.err"), os.O_WRONLY | os.O_CREAT | os.O_APPEND
    )
    os.dup2(devnull, 0)
    os.dup2(err, 1)
    os.dup2(err, 2)
    return launcher


def parse_args(argv: list[str]) -> tuple[str, bool, str | None] | None:
    """`--bundle PATH`, `--detach` and `--secrets SOURCE` (- for stdin, or a file), read by
    hand: argparse, and the re and gettext it imports, cost ~10 ms of every attempt's start.
    None for anything else (argparse reads it then: abbreviations, --help, errors). The
    bundle defaults to this file's folder's parent (scripts/.., as the wrapper's own)."""
    found: dict[str, str] = {}
    detached, rest = False, list(argv)
    while rest:
        arg = rest.pop(0)
        name, eq, value = arg.partition("=")
        if arg == "--detach":
            detached = True
        elif name in ("--bundle", "--secrets") and (eq or rest):
            found[name] = value if eq else rest.pop(0)
        else:
            return None
    bundle = found.get("--bundle") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    return (bundle, detached, found.get("--secrets"))


def load_script(name: str, bundle: str) -> Any:
    """scripts/NAME.py, imported only where it is used, so that a run needs nothing of what it
    does not use: orbit_docker (a docker launch mode's), orbit_secret_env (a run with secrets;
    as the package's own where the wrapper is)."""
    import importlib

    scripts = os.path.join(os.path.abspath(bundle), "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    try:
        return importlib.import_module(name)
    except ImportError:  # a bundle of an ORBIT before it: the package's own, if there is one
        if name != "orbit_secret_env":
            raise
        return importlib.import_module("orbit.runtime.secret_env")


def read_secrets(bundle: str, source: str | None) -> dict[str, str]:
    """`--secrets -` (stdin) or `--secrets PATH` (a file, deleted as it is read): read before
    the wrapper detaches, which leaves it no stdin."""
    if source is None:
        return {}
    found: dict[str, str] = load_script("orbit_secret_env", bundle).read(source)
    return found
