"""Tasks as users of their own: on an agent that runs as root, each attempt's wrapper and task
run under a uid taken from a range for it alone (as systemd's DynamicUser does), so that a task
reaches nothing of the agent's (its credential, its bundle cache: both root's, mode 0600/0700)
and nothing of another attempt's.

An attempt's folder stays root's (its user may pass through it, by its group); what the task
writes is its user's: its working copy (inputs/), runtime/, artifacts/, and a home and a
temporary folder of its own; job.json and scripts/ stay root's, readable by it. When the
attempt has ended, every process of its user is killed, its files in the shared temporary
folders are removed, and its folder is closed to that user (root's, 0700) before the uid is
given to another attempt: what one tenant left behind is never another's. A uid is given out
only while no account (NSS) names it, no process runs as it and no other agent on the machine
holds it (a lock file each, in /run/orbit-task-uids); the next one is taken round-robin, so
that a uid comes back as late as the range allows.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pwd
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from orbit.model.errors import InvalidInput

log = logging.getLogger("orbit.agent")

DEFAULT_UIDS = range(2_000_000_000, 2_000_001_000)
SHARED_TEMP = ("/tmp", "/var/tmp", "/dev/shm")
# where a wrapper's interpreter is looked for when the agent's own is not its users' to run
# (an agent installed under /root); the wrapper needs only a python3 >= 3.8 and its stdlib
PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


def parse_uids(text: str | None) -> range | None:
    """`--task-uids`: FIRST-LAST, or none (tasks run as the agent's own user). Default: a
    range of its own where the agent can switch users (root), else none."""
    if text is None:
        return DEFAULT_UIDS if os.geteuid() == 0 else None
    if text == "none":
        return None
    first, sep, last = text.partition("-")
    if not (sep and first.isdigit() and last.isdigit()):
        raise InvalidInput(
            f"--task-uids: expected FIRST-LAST (e.g. 2000000000-2000000999) or none, got '{text}'"
        )
    uids = range(int(first), int(last) + 1)
    if not 1000 <= uids.start < uids.stop <= 2**32 - 2:
        raise InvalidInput(f"--task-uids: '{text}' is not a range of uids from 1000 to 4294967294")
    if os.geteuid() != 0:
        raise InvalidInput(
            "--task-uids: only an agent running as root can run tasks as other users"
        )
    return uids


class TaskUsers:
    """The uids of one agent's attempts: which attempt holds which, and handing an attempt's
    folder to its user and back."""

    def __init__(self, uids: range, held: dict[str, int] | None = None) -> None:
        self.uids = uids
        self.held: dict[str, int] = dict(held or {})  # attempt id -> uid
        self.lock = threading.Lock()
        self.next = uids.start
        self.python = sys.executable
        self.locks: dict[str, int] = {}  # attempt id -> its uid's lock file (held open)

    def check(self, attempts_dir: Path) -> None:
        """At start: a user of the range can run the wrapper's interpreter and reach the
        attempts' folder; SystemExit saying what to change otherwise."""
        probe = self.uids.start
        for python in dict.fromkeys((sys.executable, *PYTHONS)):
            if _runs_as(probe, python, attempts_dir):
                self.python = python
                return
        if not _runs_as(probe, "/bin/sh", attempts_dir, shell=True):
            raise SystemExit(
                f"tasks run as users of their own (--task-uids {self.uids.start}-"
                f"{self.uids.stop - 1}), who cannot reach {attempts_dir}: give a --work-dir "
                "every user may pass through (as /var/lib/orbit-agent), or --task-uids none"
            )
        raise SystemExit(
            f"tasks run as users of their own (--task-uids {self.uids.start}-"
            f"{self.uids.stop - 1}), who cannot run this agent's python ({sys.executable}) "
            f"nor {' nor '.join(PYTHONS)}: install ORBIT where every user may read it, or "
            "give --task-uids none"
        )

    def take(self, attempt_id: str) -> int:
        with self.lock:
            if attempt_id in self.held:
                return self.held[attempt_id]
            busy = set(self.held.values())
            for _ in range(len(self.uids)):
                uid, self.next = self.next, self.next + 1
                if self.next >= self.uids.stop:
                    self.next = self.uids.start
                if uid not in busy and not _named(uid) and not _processes_of(uid):
                    lock = _lock(uid)
                    if lock is None:
                        continue  # another agent on this machine has it
                    self.held[attempt_id], self.locks[attempt_id] = uid, lock
                    return uid
        raise RuntimeError(f"no free task uid in {self.uids.start}-{self.uids.stop - 1}")

    def hold(self, attempt_id: str, attempt_dir: Path) -> None:
        """An attempt started before the agent restarted keeps its user (its folder's group,
        while the folder is open to it) until it ends."""
        group = attempt_dir.stat().st_gid
        if group in self.uids:
            with self.lock:
                self.held[attempt_id] = group
                lock = _lock(group)
                if lock is not None:
                    self.locks[attempt_id] = lock

    def uid_of(self, attempt_id: str) -> int | None:
        with self.lock:
            return self.held.get(attempt_id)

    def give_back(self, attempt_id: str, attempt_dir: Path) -> None:
        """The attempt has ended (or never started): nothing of its user runs on, nothing it
        left in the shared temporary folders stays, and its folder is root's alone."""
        uid = self.uid_of(attempt_id)
        if uid is None:
            return
        kill_user(uid)
        remove_temp_files(uid)
        with contextlib.suppress(FileNotFoundError):
            os.chown(attempt_dir, 0, 0)
            os.chmod(attempt_dir, 0o700)
        with self.lock:
            self.held.pop(attempt_id, None)
            lock = self.locks.pop(attempt_id, None)
        if lock is not None:
            os.close(lock)  # (the lock goes with it)


class AttemptUser:
    """One attempt's side of the backends' TaskUser hook (local_host_process)."""

    def __init__(self, users: TaskUsers, attempt_id: str) -> None:
        self.users, self.attempt_id = users, attempt_id

    def enter(self, attempt_dir: Path, env: dict[str, str]) -> tuple[dict[str, str], int, str]:
        uid = self.users.take(self.attempt_id)
        home, tmp = attempt_dir / "home", attempt_dir / "tmp"
        for folder in (home, tmp):
            folder.mkdir(mode=0o700)
        # what it writes is its user's: its working copy (inputs/), runtime/, artifacts/, a
        # home and a temporary folder; what the agent reads to stop it (job.json) and what
        # its wrapper runs (scripts/) stay root's, readable by its group; the folder itself
        # stays root's, so that its user cannot put a link where the agent reads
        for part in ("inputs", "runtime", "artifacts", "home", "tmp"):
            _chown_tree(attempt_dir / part, uid)
        for part in ("job.json", "scripts"):
            _readable_by_group(attempt_dir / part, uid)
        os.chown(attempt_dir, 0, uid)  # its user passes through by its group, no one else
        os.chmod(attempt_dir, 0o750)
        name = _name(uid)
        more = {"HOME": str(home), "TMPDIR": str(tmp), "USER": name, "LOGNAME": name}
        staged, relpath = env.get("ORBIT_RESUME_STAGED"), env.get("ORBIT_RESUME_RELPATH")
        if staged and relpath:  # the checkpoint goes in now, as its user's
            target = attempt_dir / "artifacts" / relpath
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, target)
            _chown_tree(attempt_dir / "artifacts", uid)
            more["ORBIT_RESUME_STAGED"] = str(target)
        return more, uid, self.users.python

    def leave(self, attempt_dir: Path) -> None:
        self.users.give_back(self.attempt_id, attempt_dir)


def _chown_tree(top: Path, uid: int) -> None:
    """`top` and everything under it to uid:uid, links themselves (never what they point to)."""
    os.chown(top, uid, uid, follow_symlinks=False)
    for root, dirs, files in os.walk(top):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)


def _readable_by_group(top: Path, gid: int) -> None:
    """`top` and everything under it root's, readable (and passable) by group `gid`."""
    paths = [top] if top.is_file() else [top, *top.rglob("*")]
    for path in paths:
        if path.is_symlink():
            continue
        os.chown(path, 0, gid)
        mode = path.stat().st_mode
        more = 0o040 | (0o010 if path.is_dir() or mode & 0o100 else 0)
        os.chmod(path, (mode & 0o7777) | more)


# (on a machine without /run, in /var/lib: a place a restart does not clear is fine too, the
# locks being held by open files, not by the files being there)
UID_LOCKS = Path("/run" if os.path.isdir("/run") else "/var/lib") / "orbit-task-uids"


def _lock(uid: int) -> int | None:
    """An open file locked for `uid` (agents on one machine share no task user), or None
    when another process holds it."""
    UID_LOCKS.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(UID_LOCKS / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"orbit-{uid}"


def _named(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _processes_of(uid: int) -> list[int]:
    """The live processes with `uid` among their real, effective, saved or file-system uids,
    by /proc/PID/status (its folder's owner would miss a process made non-dumpable). A zombie
    is not one: it runs nothing and holds nothing, and it stays until its parent reaps it,
    which for an orphan is pid 1, whenever that gets to it (seconds on a loaded machine)."""
    found, want = [], str(uid)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{name}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("State:") and line.split()[1] in ("Z", "X"):
                    break
                if line.startswith("Uid:"):
                    if want in line.split()[1:]:
                        found.append(int(name))
                    break
    return found


def kill_user(uid: int) -> None:
    """SIGKILL every process of `uid` until none is left alive (it may fork meanwhile)."""
    for _ in range(50):
        pids = _processes_of(uid)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    log.warning("processes of task uid %s still there after 50 rounds of SIGKILL", uid)


def remove_temp_files(uid: int) -> None:
    """What `uid` left at the top of the shared temporary folders (a socket, shared memory
    of a data loader, a cache with a token in it)."""
    for top in SHARED_TEMP:
        with contextlib.suppress(OSError), os.scandir(top) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid != uid:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)


def _runs_as(uid: int, python: str, attempts_dir: Path, shell: bool = False) -> bool:
    """Whether `uid` can run `python` (3.8 or newer) and pass through `attempts_dir`."""
    check = (
        ["/bin/sh", "-c", 'cd "$1"', "sh", str(attempts_dir)]
        if shell
        else [python, "-S", "-c", CHECK, str(attempts_dir)]
    )
    try:
        done = subprocess.run(
            check,
            user=uid,
            group=uid,
            extra_groups=[],
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


CHECK = "import os, sys; sys.exit(sys.version_info < (3, 8) or not os.access(sys.argv[1], os.X_OK))"
