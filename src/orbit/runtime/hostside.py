#!/usr/bin/env python3
"""What ORBIT does on the host where attempts run, with python3's standard library only.

The local backend imports these functions; an SSH backend sends this file as the program of
`ssh HOST python3 - COMMAND ARGS...` (so nothing is installed on the host) and reads one JSON
object from stdout. Bytes travel base64-encoded.

Layout under the host's work dir:
  bundles/DIGEST/         frozen bundles, one per digest (complete when .orbit-complete exists)
  bundles/.partial-DIGEST/  a transfer in progress; a later push continues it
  attempts/ATTEMPT_ID/    one attempt's copy of the bundle, with its own runtime/ and artifacts/

Processes are ORBIT's only by their environment: everything an attempt starts (its wrapper,
its task and whatever that starts, even outside its process group) carries ORBIT_ATTEMPT_ID,
and ORBIT_PLANE names the control plane that launched it. Nothing else is ever signalled.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import fcntl
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

COMPLETE = ".orbit-complete"
FROZEN_PARTS = ("job.json", "inputs", "scripts")
MARKER = b"ORBIT_ATTEMPT_ID="
PLANE = b"ORBIT_PLANE="
MAX_GRACE_S = 20.0  # a sweep waits at most this for a graceful end (it runs inside an ssh call)


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


def _environ(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:  # gone, a zombie, or not ours to read
        return []


def _stat(pid: int) -> list[bytes] | None:
    """/proc/PID/stat's fields after the command name: state, ppid, ..."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2 :].split()


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != b"Z"


def ourselves() -> set[int]:
    """This process and its parents: never signalled, whatever their environment says."""
    found, pid = {os.getpid()}, os.getpid()
    while pid > 1:
        fields = _stat(pid)
        if fields is None:
            break
        pid = int(fields[1])
        found.add(pid)
    return found


def attempt_processes(plane: str | None = None) -> dict[int, str]:
    """pid -> attempt id of every live process carrying ORBIT's marker (and, given `plane`,
    that control plane's). Where there is no /proc, none."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    skip, found = ourselves(), {}
    for name in names:
        if not name.isdigit() or int(name) in skip:
            continue
        environ = _environ(int(name))
        ids = [e[len(MARKER) :] for e in environ if e.startswith(MARKER)]
        if not ids or (plane is not None and PLANE + plane.encode() not in environ):
            continue
        found[int(name)] = ids[0].decode(errors="replace")
    return found


def marked(marks: list[str], keep: set[int]) -> list[int]:
    """The live processes, but those in `keep`, whose environment holds every one of `marks`
    ("NAME=value")."""
    wanted = [m.encode() for m in marks]
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in keep:
            continue
        environ = _environ(int(name))
        if environ and all(m in environ for m in wanted):
            found.append(int(name))
    return found


def stop_processes(select: Callable[[], Iterable[int]], grace: float) -> list[int]:
    """SIGTERM the processes `select()` returns, SIGKILL those still there after `grace` (looking
    again: they may have started more); the pids signalled."""
    signalled: set[int] = set()
    for sig, wait, rounds in ((signal.SIGTERM, grace, 1), (signal.SIGKILL, 1.0, 5)):
        for _ in range(rounds):
            pids = list(select())
            if not pids:
                return sorted(signalled)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
                    signalled.add(pid)
            deadline = time.monotonic() + wait
            while pids and time.monotonic() < deadline:
                time.sleep(0.05)
                pids = [pid for pid in pids if _alive(pid)]
    return sorted(signalled)


def _grace(attempt_dir: str) -> float:
    try:
        with open(os.path.join(attempt_dir, "job.json"), encoding="utf-8") as f:
            grace = float(json.load(f).get("stop_grace_s", 10.0))
    except (OSError, ValueError, TypeError, AttributeError):
        grace = 10.0
    return min(max(grace, 0.0), MAX_GRACE_S)


def _say_why(attempt_dir: str, why: str) -> None:
    """A wrapper about to get SIGTERM records its end as asked for, not as a preemption."""
    runtime = os.path.join(attempt_dir, "runtime")
    path = os.path.join(runtime, "stop_request.json")
    if os.path.isdir(runtime) and not os.path.exists(path):
        at = datetime.datetime.now(datetime.timezone.utc).isoformat()
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps({"reason": "cancelled", "at": at, "message": why}) + "\n")


def stop_attempt(attempt_dir: str, attempt_id: str) -> dict[str, Any]:
    """Stop what still runs of an attempt the control plane has ended (its wrapper included):
    SIGTERM, SIGKILL after the job's grace period."""

    def mine() -> list[int]:
        return [pid for pid, a in attempt_processes().items() if a == attempt_id]

    if not mine():
        return {"stopped": []}
    _say_why(attempt_dir, "stopped after the attempt had ended (orbit cancel)")
    return {"stopped": stop_processes(mine, _grace(attempt_dir))}


def stop_ended(attempts_dir: str, live: list[str], plane: str) -> dict[str, Any]:
    """Stop every process of this control plane's attempts under `attempts_dir` that are not
    among the `live` ones the control plane knows: attempts it has ended (given up on while
    the host did not answer, say) whose processes went on. {attempt id: pids stopped}."""
    attempts_dir = os.path.abspath(os.path.expanduser(attempts_dir))
    if not plane:
        return {"error": "no control plane named: nothing is stopped"}
    keep = set(live)

    def ended() -> dict[int, str]:
        return {
            pid: a
            for pid, a in attempt_processes(plane).items()
            if a not in keep and a and "/" not in a and os.path.isdir(os.path.join(attempts_dir, a))
        }

    found = ended()
    if not found:
        return {"stopped": {}}
    for attempt_id in set(found.values()):
        _say_why(os.path.join(attempts_dir, attempt_id), "the control plane had ended this attempt")
    grace = max(_grace(os.path.join(attempts_dir, a)) for a in set(found.values()))
    owner = dict(found)

    targets = set(found.values())

    def select() -> list[int]:
        # only the attempts found ended at the start: one launched while this sweep waits out
        # its grace period is not among the live ids it was given, and must not be touched
        now = {pid: a for pid, a in ended().items() if a in targets}
        owner.update(now)
        return list(now)

    stopped: dict[str, list[int]] = {}
    for pid in stop_processes(select, grace):
        stopped.setdefault(owner[pid], []).append(pid)
    return {"stopped": stopped}


def probe(attempt_dir: str, attempt_id: str, rank: str = "") -> dict[str, Any]:
    """runtime/status.json and result.json, whether the wrapper lives, and, when it died
    without a result, the killing of its orphaned task (never a stranger that reused the pid;
    given a rank of a run across nodes, never another rank's process on a shared host)."""
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
        # and what had left the task's process group: nobody else will stop it now. A bundle
        # run by hand is "manual", like every other run by hand: its folder must match too
        marks = [f"{MARKER.decode()}{attempt_id}"]
        if rank:
            marks.append(f"ORBIT_NODE_RANK={rank}")
        if attempt_id == "manual":
            marks.append(f"ORBIT_BUNDLE_DIR={os.path.abspath(attempt_dir)}")
        with contextlib.suppress(OSError):  # no /proc (not Linux): the group was all there was
            stop_processes(lambda: marked(marks, ourselves()), 0)
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


def compile_scripts(bundle: str) -> None:
    """Byte-compile a host's cached copy of a bundle's scripts/ once, for this interpreter
    (the wrapper's and the NVML audit's): every attempt's copy then carries the .pyc files
    (copies keep the sources' mtimes), instead of each attempt compiling the vendored
    pynvml.py (330 kB, ~0.1 s of CPU) twice, in the audit and in the precheck. Best effort."""
    import compileall  # here: the wrapper imports this file at every attempt's end

    with contextlib.suppress(Exception):
        compileall.compile_dir(os.path.join(bundle, "scripts"), maxlevels=0, quiet=2)


def stage_commit(work: str, digest: str) -> dict[str, Any]:
    """A finished transfer becomes the bundle for its digest, atomically."""
    partial = os.path.join(work, "bundles", f".partial-{digest}")
    final = os.path.join(work, "bundles", digest)
    missing = [p for p in FROZEN_PARTS if not os.path.exists(os.path.join(partial, p))]
    if missing:
        return {"error": f"the transfer into {partial} lacks {', '.join(missing)}"}
    compile_scripts(partial)
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
        if os.path.exists(os.path.join(dest, "runtime", "pid")):
            return {"error": f"{dest} already exists: attempt {attempt_id} was launched before"}
        shutil.rmtree(dest)  # prepared before, never launched (its reply was lost): again
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
            # -S: the wrapper needs only the standard library and its bundle's scripts/, not
            # site-packages' start-up (.pth files cost 5-15 ms a start on a full interpreter)
            [sys.executable, "-S", wrapper, "--bundle", attempt_dir, "--detach"],
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
        return probe(*args[:3])
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
    if command == "stop-attempt":
        return stop_attempt(args[0], args[1])
    if command == "stop-ended":  # ATTEMPTS_DIR PLANE LIVE_IDS,... (in as many arguments)
        return stop_ended(args[0], [a for arg in args[2:] for a in arg.split(",") if a], args[1])
    return {"error": f"unknown command {command!r}"}


if __name__ == "__main__":
    try:
        out = main(sys.argv[1:])
    except Exception as exc:  # reported, not raised: the caller reads one JSON object
        out = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(out) + "\n")


_STEP = re.compile(r"(\d+)(?:\.[A-Za-z0-9]+)?$")
_SWIFT_RUN = re.compile(r"^v(\d+)-")  # ms-swift's output_dir/vN-DATE-TIME/checkpoint-N


def _newest_swift_runs(artifacts: str) -> list[str]:
    """In each folder of `artifacts` that holds ms-swift run folders, the newest that has a
    checkpoint: the highest vN by number (v10 after v9; a failed start leaves an empty one)."""
    found: dict[str, tuple[int, str]] = {}
    for run in glob.glob(os.path.join(glob.escape(artifacts), "*", "v*-*")):
        m = _SWIFT_RUN.match(os.path.basename(run))
        if m and glob.glob(os.path.join(glob.escape(run), "checkpoint-*")):
            parent = os.path.dirname(run)
            found[parent] = max(found.get(parent, (-1, "")), (int(m.group(1)), run))
    return [run for _, run in found.values()]


def newest_checkpoint(artifacts: str) -> str | None:
    """The newest checkpoint an attempt left under its artifacts folder, as a path relative to
    it, by ORBIT's convention: an entry of `checkpoints/` (a file or a folder), or a folder
    named `checkpoint-*` up to two levels down (HF Trainer's and ms-swift's
    `output_dir/checkpoint-500`), or a `checkpoint-*` of the newest ms-swift run folder
    (`checkpoints/vN-DATE-TIME/checkpoint-500`). Newest: the highest step number in the
    name, then the latest change; None without one. Where some `checkpoint-*` folders hold
    `trainer_state.json` (HF Trainer's, and so ms-swift's, last file of a save), one without
    it is a save cut short (a stop during it) and is passed over."""
    found: list[tuple[int, float, str]] = []

    def consider(path: str) -> None:
        name = os.path.basename(path)
        if name.startswith(".") or name.endswith((".tmp", ".partial")):
            return  # being written, or left half-written
        m = _STEP.search(name)
        with contextlib.suppress(OSError):
            found.append((int(m.group(1)) if m else -1, os.stat(path).st_mtime, path))

    for entry in glob.glob(os.path.join(glob.escape(artifacts), "checkpoints", "*")):
        if not (_SWIFT_RUN.match(os.path.basename(entry)) and os.path.isdir(entry)):
            consider(entry)
    for run in _newest_swift_runs(artifacts):
        for entry in glob.glob(os.path.join(glob.escape(run), "checkpoint-*")):
            if os.path.isdir(entry):
                consider(entry)
    for depth in ("*", os.path.join("*", "*")):
        pattern = os.path.join(glob.escape(artifacts), depth)
        for entry in glob.glob(pattern):
            if os.path.basename(entry).startswith("checkpoint-") and os.path.isdir(entry):
                consider(entry)
    saves = [f for f in found if os.path.basename(f[2]).startswith("checkpoint-")]
    if any(_saved(f[2]) for f in saves):
        found = [f for f in found if f not in saves or _saved(f[2])]
    if not found:
        return None
    return os.path.relpath(max(found)[2], artifacts)


def _saved(checkpoint: str) -> bool:
    """Whether an HF Trainer checkpoint folder was written to its end (as the swift launcher,
    the workdir's swift_launch.py, reads it too)."""
    return os.path.exists(os.path.join(checkpoint, "trainer_state.json"))
