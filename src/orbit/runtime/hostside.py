#!/usr/bin/env python3
"""What ORBIT does on the host where attempts run, with python3's standard library only.

The local backend imports these functions; an SSH backend sends this file as the program of
`ssh HOST python3 - COMMAND ARGS...` (so nothing is installed on the host) and reads one JSON
object from stdout. Bytes travel base64-encoded.

Layout under the host's work dir:
  bundles/DIGEST/         frozen bundles, one per digest (complete when .orbit-complete exists)
  bundles/.partial-DIGEST/  a transfer in progress; a later push continues it
  attempts/ATTEMPT_ID/    one attempt's copy of the bundle, with its own runtime/ and artifacts/
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import fcntl
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
from typing import Any

COMPLETE = ".orbit-complete"
FROZEN_PARTS = ("job.json", "inputs", "scripts")


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def wrapper_alive(runtime: str) -> bool:
    """The wrapper holds runtime/lock for its whole life; if we can take it, it is gone.
    Unlike a pid, a lock cannot be mistaken for a stranger's process that reused the number."""
    try:
        fd = os.open(os.path.join(runtime, "lock"), os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def runs_attempt(pid: int, attempt_id: str) -> bool:
    """Whether `pid` is still this attempt's task: its environment names the attempt."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:  # gone, not ours to read, or no /proc: leave it alone
        return False
    return f"ORBIT_ATTEMPT_ID={attempt_id}".encode() in environ.split(b"\0")


def probe(attempt_dir: str, attempt_id: str) -> dict[str, Any]:
    """runtime/status.json and result.json, whether the wrapper lives, and, when it died
    without a result, the killing of its orphaned task (never a stranger that reused the pid)."""
    runtime = os.path.join(attempt_dir, "runtime")
    if not os.path.isdir(runtime):
        return {"missing": True}
    alive = wrapper_alive(runtime)
    status = _read_text(os.path.join(runtime, "status.json"))
    result = _read_text(os.path.join(runtime, "result.json"))
    killed = None
    if not alive and result is None and status:
        with contextlib.suppress(ValueError, TypeError, KeyError):
            pid = int(json.loads(status)["task_pid"])
            if runs_attempt(pid, attempt_id):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                    killed = pid
    return {"alive": alive, "status": status, "result": result, "killed_orphan": killed}


def read_from(path: str, offset: int, limit: int) -> bytes | None:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(limit)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def tail(root: str, pattern: str, limit: int) -> dict[str, bytes]:
    found = {}
    for path in sorted(glob.glob(os.path.join(root, pattern), recursive=True)):
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - limit))
                found[os.path.relpath(path, root)] = f.read(limit)
    return found


def cancel(attempt_dir: str, reason: str) -> bool:
    """Say why in runtime/stop_request.json, then SIGTERM the wrapper (it stops the task
    gracefully and kills it after the grace period). False when no wrapper runs."""
    runtime = os.path.join(attempt_dir, "runtime")
    at = datetime.datetime.now(datetime.timezone.utc).isoformat()
    with open(os.path.join(runtime, "stop_request.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps({"reason": reason, "at": at}) + "\n")
    pid = (_read_text(os.path.join(runtime, "pid")) or "").strip()
    if not pid or not wrapper_alive(runtime):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(int(pid), signal.SIGTERM)
    return True


def stage_check(work: str, digest: str) -> dict[str, Any]:
    """Make the work dir's layout; whether the bundle is already complete there."""
    work = os.path.abspath(os.path.expanduser(work))
    for part in ("bundles", "attempts"):
        os.makedirs(os.path.join(work, part), exist_ok=True)
    cached = os.path.exists(os.path.join(work, "bundles", digest, COMPLETE))
    return {"work": work, "cached": cached, "partial": f"bundles/.partial-{digest}"}


def stage_commit(work: str, digest: str) -> dict[str, Any]:
    """A finished transfer becomes the bundle for its digest, atomically."""
    partial = os.path.join(work, "bundles", f".partial-{digest}")
    final = os.path.join(work, "bundles", digest)
    missing = [p for p in FROZEN_PARTS if not os.path.exists(os.path.join(partial, p))]
    if missing:
        return {"error": f"the transfer into {partial} lacks {', '.join(missing)}"}
    with open(os.path.join(partial, COMPLETE), "w", encoding="utf-8") as f:
        f.write(digest + "\n")
    if os.path.exists(os.path.join(final, COMPLETE)):  # another push finished first
        shutil.rmtree(partial, ignore_errors=True)
    else:
        shutil.rmtree(final, ignore_errors=True)  # an incomplete leftover of another layout
        os.rename(partial, final)
    return {"bundle": final}


def stage_abort(work: str, digest: str) -> dict[str, Any]:
    shutil.rmtree(os.path.join(work, "bundles", f".partial-{digest}"), ignore_errors=True)
    return {}


def prepare(work: str, digest: str, attempt_id: str) -> dict[str, Any]:
    """The attempt's own copy of the cached bundle, with fresh, empty runtime/ and artifacts/.
    runtime/ is made last: a folder without it is a copy that never finished."""
    bundle = os.path.join(work, "bundles", digest)
    dest = os.path.join(work, "attempts", attempt_id)
    if not os.path.exists(os.path.join(bundle, COMPLETE)):
        return {"error": f"bundle {digest[:12]} is not staged in {bundle}"}
    if os.path.exists(dest):
        return {"error": f"{dest} already exists: attempt {attempt_id} was prepared before"}
    try:
        os.makedirs(dest)
        shutil.copy2(os.path.join(bundle, "job.json"), os.path.join(dest, "job.json"))
        for part in ("inputs", "scripts"):
            shutil.copytree(os.path.join(bundle, part), os.path.join(dest, part), symlinks=True)
        for part in ("artifacts", "runtime"):
            os.mkdir(os.path.join(dest, part))
    except OSError as exc:
        shutil.rmtree(dest, ignore_errors=True)
        return {"error": f"copying the bundle into {dest}: {exc}"}
    return {"location": dest}


def launch(
    attempt_dir: str, env: dict[str, str], base: dict[str, str] | None = None
) -> dict[str, Any]:
    """Start the attempt's wrapper detached: a new session, its pid in runtime/pid. Its
    environment is `base` (default: this process's) with `env` laid over it."""
    wrapper = os.path.join(attempt_dir, "scripts", "orbit_wrapper.py")
    try:
        proc = subprocess.run(
            [sys.executable, wrapper, "--bundle", attempt_dir, "--detach"],
            env={**(os.environ if base is None else base), **env},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"starting the wrapper: {exc}"}
    if proc.returncode != 0:
        detail = proc.stderr.strip() or _read_text(
            os.path.join(attempt_dir, "runtime", "wrapper.err")
        )
        return {"error": f"the runtime wrapper did not start: {(detail or '')[-500:]}"}
    return {"location": attempt_dir, "pid": int(proc.stdout.strip() or 0)}


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def main(argv: list[str]) -> dict[str, Any]:
    command, args = argv[0], argv[1:]
    if command == "probe":
        return probe(args[0], args[1])
    if command == "read":
        return {"data": _b64(read_from(args[0], int(args[1]), int(args[2])))}
    if command == "tail":
        found = tail(args[0], args[1], int(args[2]))
        return {"files": {k: _b64(v) for k, v in found.items()}}
    if command == "cancel":
        return {"signalled": cancel(args[0], args[1])}
    if command == "stage-check":
        return stage_check(args[0], args[1])
    if command == "stage-commit":
        return stage_commit(args[0], args[1])
    if command == "stage-abort":
        return stage_abort(args[0], args[1])
    if command == "prepare":
        return prepare(args[0], args[1], args[2])
    if command == "launch":
        return launch(args[0], dict(item.split("=", 1) for item in args[1:]))
    return {"error": f"unknown command {command!r}"}


if __name__ == "__main__":
    try:
        out = main(sys.argv[1:])
    except Exception as exc:  # reported, not raised: the caller reads one JSON object
        out = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(out) + "\n")
