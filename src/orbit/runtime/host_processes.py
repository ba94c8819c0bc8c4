"""The processes ORBIT finds and stops on a host where attempts run, by their marks.

Processes are ORBIT's only by their environment: everything an attempt starts (its wrapper,
its task and whatever that starts, even outside its process group) carries ORBIT_ATTEMPT_ID,
and ORBIT_PLANE names the control plane that launched it. Nothing else is ever signalled.
Standard library only, and Linux's /proc: it travels beside hostside and the wrapper
(scripts/orbit_host_processes.py; see orbit.runtime.hostside).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # as mypy reads it
    from orbit.runtime import host_files
else:
    try:  # in a bundle's scripts/, or sent over SSH: beside this file (see hostside)
        import orbit_host_files as host_files
    except ImportError:  # as part of the orbit package
        from orbit.runtime import host_files

MARKER = b"ORBIT_ATTEMPT_ID="
PLANE = b"ORBIT_PLANE="
MAX_GRACE_S = 20.0  # a sweep waits at most this for a graceful end (it runs inside an ssh call)


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


def stop_grace(attempt_dir: str) -> float:
    """The job's stop_grace_s (its job.json), at most MAX_GRACE_S; 10 s where unreadable."""
    try:
        job = json.loads(host_files.read_text(os.path.join(attempt_dir, "job.json")) or "")
        grace = float(job["stop_grace_s"])
    except (OSError, ValueError, TypeError, KeyError):
        grace = 10.0
    return min(max(grace, 0.0), MAX_GRACE_S)


def holds(pid: int, lock: os.stat_result) -> bool:
    """Whether process `pid` has the file `lock` (its device and inode) open: the wrapper
    holds its runtime/lock for its whole life, so a pid read from a file a task may write is
    signalled only when it is the wrapper's (by the file itself, not by a path a task could
    swap meanwhile). Where there is no /proc to tell, True."""
    if not os.path.isdir("/proc/self/fd"):
        return True
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            st = os.stat(f"/proc/{pid}/fd/{fd}")  # the open file itself
            if (st.st_dev, st.st_ino) == (lock.st_dev, lock.st_ino):
                return True
    return False


def _say_why(attempt_dir: str, why: str) -> None:
    """A wrapper about to get SIGTERM records its end as asked for, not as a preemption."""
    runtime = os.path.join(attempt_dir, "runtime")
    path = os.path.join(runtime, "stop_request.json")
    if os.path.isdir(runtime) and not os.path.lexists(path):
        at = datetime.datetime.now(datetime.timezone.utc).isoformat()
        host_files.write_nofollow(
            path, json.dumps({"reason": "cancelled", "at": at, "message": why}) + "\n"
        )


def stop_attempt(attempt_dir: str, attempt_id: str) -> dict[str, Any]:
    """Stop what still runs of an attempt the control plane has ended (its wrapper included):
    SIGTERM, SIGKILL after the job's grace period."""

    def mine() -> list[int]:
        return [pid for pid, a in attempt_processes().items() if a == attempt_id]

    if not mine():
        return {"stopped": []}
    _say_why(attempt_dir, "stopped after the attempt had ended (orbit cancel)")
    return {"stopped": stop_processes(mine, stop_grace(attempt_dir))}


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
    grace = max(stop_grace(os.path.join(attempts_dir, a)) for a in set(found.values()))
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
