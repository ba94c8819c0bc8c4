#!/usr/bin/env python3
"""What ORBIT does on the host where attempts run, with python3's standard library only:
stage a bundle, prepare and launch an attempt, read its state and files, cancel it, stop
what it left running. Bytes travel base64-encoded.

The local backends and the agent import it as orbit.runtime.hostside; every bundle carries it
as scripts/orbit_hostside.py (a Slurm job runs it there: `python -S orbit_hostside.py probe
...`); an SSH backend sends it as the program of `ssh HOST python3 - COMMAND ARGS...`, so
nothing is installed on the host, and reads one JSON object from stdout. Its siblings, each
one job, travel with it the same three ways: host_files (reading what a task may have
written), host_processes (the processes of attempts, by their marks) and host_staging (the
cached bundles and attempts' verified copies, and the layout of the work dir). Over SSH they
arrive inside the one program that orbit.core.execution.ssh.transport assembles.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import fcntl
import glob
import json
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # as mypy reads them
    from orbit.runtime import host_files, host_processes, host_staging
else:
    try:  # in a bundle's scripts/, or sent over SSH: the siblings beside this file
        import orbit_host_files as host_files
        import orbit_host_processes as host_processes
        import orbit_host_staging as host_staging
    except ImportError:  # as part of the orbit package
        from orbit.runtime import host_files, host_processes, host_staging


def wrapper_alive(runtime: str) -> bool:
    """The wrapper holds runtime/lock for its whole life; if we can take it, it is gone.
    Unlike a pid, a lock cannot be mistaken for a stranger's process that reused the number."""
    return _held_lock(runtime) is not None


def probe(attempt_dir: str, attempt_id: str, rank: str = "") -> dict[str, Any]:
    """runtime/status.json and result.json, whether the wrapper lives, and, when it died
    without a result, the killing of its orphaned task (never a stranger that reused the pid;
    given a rank of a run across nodes, never another rank's process on a shared host)."""
    runtime = os.path.join(attempt_dir, "runtime")
    if not os.path.isdir(runtime):
        return {"missing": True}
    alive = wrapper_alive(runtime)
    status = host_files.read_text(os.path.join(runtime, "status.json"))
    result = host_files.read_text(os.path.join(runtime, "result.json"))
    killed = None
    if not alive and result is None and status:
        with contextlib.suppress(ValueError, TypeError, KeyError):
            pid = int(json.loads(status)["task_pid"])
            if host_processes.runs_attempt(pid, attempt_id):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                    killed = pid
        # and what had left the task's process group: nobody else will stop it now. A bundle
        # run by hand is "manual", like every other run by hand: its folder must match too
        marks = [f"{host_processes.MARKER.decode()}{attempt_id}"]
        if rank:
            marks.append(f"ORBIT_NODE_RANK={rank}")
        if attempt_id == "manual":
            marks.append(f"ORBIT_BUNDLE_DIR={os.path.abspath(attempt_dir)}")
        with contextlib.suppress(OSError):  # no /proc (not Linux): the group was all there was
            host_processes.stop_processes(
                lambda: host_processes.marked(marks, host_processes.ourselves()), 0
            )
    return {"alive": alive, "status": status, "result": result, "killed_orphan": killed}


def read_from(path: str, offset: int, limit: int) -> bytes | None:
    try:
        with os.fdopen(host_files.open_file(path), "rb") as f:
            f.seek(offset)
            return f.read(limit)
    except (FileNotFoundError, NotADirectoryError):
        return None


def read_range(path: str, offset: int, limit: int) -> tuple[bytes, int]:
    """At most `limit` bytes of a file from `offset`, and its size then; a missing file reads
    as empty, of size 0."""
    try:
        with os.fdopen(host_files.open_file(path), "rb") as f:
            f.seek(offset)
            return f.read(limit), os.fstat(f.fileno()).st_size
    except (FileNotFoundError, NotADirectoryError):
        return b"", 0


def read_end(path: str, limit: int) -> tuple[bytes, int]:
    """The last `limit` bytes of a file and its size then; a missing file reads as empty."""
    try:
        with os.fdopen(host_files.open_file(path), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - limit))
            data = f.read(limit)
            return data, f.tell()
    except (FileNotFoundError, NotADirectoryError):
        return b"", 0


def tail(root: str, pattern: str, limit: int) -> dict[str, bytes]:
    found = {}
    for path in sorted(glob.glob(os.path.join(root, pattern), recursive=True)):
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):  # 3.8: no (a, b)
            with os.fdopen(host_files.open_file(path), "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
                found[os.path.relpath(path, root)] = f.read(limit)
    return found


def cancel(
    attempt_dir: str, reason: str, grace_s: float | None = None, message: str | None = None
) -> bool:
    """Say why in runtime/stop_request.json, then SIGTERM the wrapper (it stops the task
    gracefully and kills it after the grace period, or after `grace_s` if that is shorter).
    False when no wrapper runs."""
    runtime = os.path.join(attempt_dir, "runtime")
    at = datetime.datetime.now(datetime.timezone.utc).isoformat()
    request: dict[str, Any] = {"reason": reason, "at": at}
    if grace_s is not None:
        request["grace_s"] = grace_s
    if message:
        request["message"] = message
    host_files.write_nofollow(
        os.path.join(runtime, "stop_request.json"), json.dumps(request) + "\n"
    )
    pid = (host_files.read_text(os.path.join(runtime, "pid")) or "").strip()
    lock = _held_lock(runtime)
    if not pid.isdigit() or lock is None:
        return False
    if not host_processes.holds(int(pid), lock):
        return False  # not the wrapper's pid (the file was rewritten): nobody is signalled
    with contextlib.suppress(ProcessLookupError):
        os.kill(int(pid), signal.SIGTERM)
    return True


def _held_lock(runtime: str) -> os.stat_result | None:
    """runtime/lock (the file itself) while a wrapper holds it, else None."""
    try:
        fd = host_files.open_file(os.path.join(runtime, "lock"))
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.fstat(fd)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def launch(
    attempt_dir: str,
    env: dict[str, str],
    base: dict[str, str] | None = None,
    uid: int | None = None,
    python: str | None = None,
    secrets: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Start the attempt's wrapper detached: a new session, its pid in runtime/pid. Its
    environment is `base` (default: this process's) with `env` laid over it. Given `uid`
    (an agent as root), the wrapper, and so the task, runs as that user and group, with no
    other groups; `python`: the interpreter to run it with (default: this one). `secrets`
    reach the wrapper on its stdin, never its command line or environment."""
    wrapper = os.path.join(attempt_dir, "scripts", "orbit_wrapper.py")
    as_user: dict[str, Any] = {}
    if uid is not None:  # Python >= 3.9 (an agent's own, never a bare host's)
        as_user = {"user": uid, "group": uid, "extra_groups": []}
    # -S: the wrapper needs only the standard library and its bundle's scripts/, not
    # site-packages' start-up (.pth files cost 5-15 ms a start on a full interpreter)
    argv = [python or sys.executable, "-S", wrapper, "--bundle", attempt_dir, "--detach"]
    given: dict[str, Any] = {"stdin": subprocess.DEVNULL}
    if secrets:
        argv += ["--secrets", "-"]
        given = {"input": json.dumps(secrets)}
    try:
        proc = subprocess.run(
            argv,
            env={**(os.environ if base is None else base), **env},
            capture_output=True,
            text=True,
            timeout=60,
            **given,
            **as_user,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"starting the wrapper: {exc}"}
    if proc.returncode != 0:
        detail = proc.stderr.strip() or host_files.read_text(
            os.path.join(attempt_dir, "runtime", "wrapper.err")
        )
        return {"error": f"the runtime wrapper did not start: {(detail or '')[-500:]}"}
    return {"location": attempt_dir, "pid": int(proc.stdout.strip() or 0)}


SECRETS_DIR = "secrets"  # under a Slurm attempt's folder: rank-N.json, one per rank's wrapper


def put_secrets(attempt_dir: str, ranks: int, secrets: dict[str, str]) -> dict[str, Any]:
    """A launch's secrets for a wrapper no launcher starts (a Slurm job's): a file of mode
    0600 per rank, in a folder of mode 0700, each read and deleted by its rank's wrapper
    (`--secrets PATH`); what the job leaves unread it removes at its end."""
    folder = os.path.join(attempt_dir, SECRETS_DIR)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    data = json.dumps(secrets).encode("utf-8")
    for rank in range(ranks):
        path = os.path.join(folder, f"rank-{rank}.json")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(path, flags, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    return {"written": ranks}


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def main(argv: list[str]) -> dict[str, Any]:
    command, args = argv[0], argv[1:]
    if command == "probe":
        return probe(*args[:3])
    if command == "read":
        return {"data": _b64(read_from(args[0], int(args[1]), int(args[2])))}
    if command == "read-range":
        data, size = read_range(args[0], int(args[1]), int(args[2]))
        return {"data": _b64(data), "size": size}
    if command == "read-end":
        data, end = read_end(args[0], int(args[1]))
        return {"data": _b64(data), "end": end}
    if command == "tail":
        found = tail(args[0], args[1], int(args[2]))
        return {"files": {k: _b64(v) for k, v in found.items()}}
    if command == "cancel":
        return {"signalled": cancel(args[0], args[1])}
    if command == "stage-check":
        return host_staging.stage_check(args[0], args[1])
    if command == "stage-commit":
        return host_staging.stage_commit(args[0], args[1])
    if command == "stage-abort":
        return host_staging.stage_abort(args[0], args[1])
    if command == "prepare":
        return host_staging.prepare(args[0], args[1], args[2])
    if command == "copy":  # FROZEN DEST DIGEST: a rank's own copy (a Slurm job's other nodes)
        return host_staging.copy_attempt(args[0], args[1], args[2])
    if command == "launch":  # the secrets, if any, came in the program itself (over ssh)
        env = dict(item.split("=", 1) for item in args[1:])
        return launch(args[0], env, secrets=globals().get("ORBIT_SECRETS") or None)
    if command == "put-secrets":  # LOCATION RANKS, the secrets in the program (over ssh)
        return put_secrets(args[0], int(args[1]), globals().get("ORBIT_SECRETS") or {})
    if command == "stop-attempt":
        return host_processes.stop_attempt(args[0], args[1])
    if command == "stop-ended":  # ATTEMPTS_DIR PLANE LIVE_IDS,... (in as many arguments)
        return host_processes.stop_ended(
            args[0], [a for arg in args[2:] for a in arg.split(",") if a], args[1]
        )
    return {"error": f"unknown command {command!r}"}


if __name__ == "__main__":
    try:
        out = main(sys.argv[1:])
    except Exception as exc:  # reported, not raised: the caller reads one JSON object
        out = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(out) + "\n")
