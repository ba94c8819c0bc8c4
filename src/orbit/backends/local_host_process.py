"""`local_host_process`: the attempt runs on this machine as a detached process."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from orbit.artifacts import CollectResult, verify_manifest
from orbit.backends.base import AttemptContext, LaunchError, LogLayer
from orbit.bundle import FrozenBundle, copy_frozen
from orbit.errors import Refused
from orbit.models import ExecutionRequest, FailureReason, RunHandle, RunStatus
from orbit.runtime_state import parse_json, status_from_files

LOCAL_TARGETS = {None, "localhost", "local"}
READ_CHUNK = 1 << 20


def wrapper_alive(runtime: Path) -> bool:
    """The wrapper holds runtime/lock for its whole life; if we can take it, it is gone.
    Unlike a pid, a lock cannot be mistaken for a stranger's process that reused the number."""
    try:
        fd = os.open(runtime / "lock", os.O_RDONLY)
    except FileNotFoundError:
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


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


class LocalHostProcessBackend:
    key = "local_host_process"

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir

    def validate(self, request: ExecutionRequest) -> None:
        if request.target not in LOCAL_TARGETS:
            raise Refused(
                f"target '{request.target}' is not this machine: the '{request.template_id}' "
                "template runs locally (use a template with an ssh placement for other hosts)"
            )

    def launch(
        self, bundle: FrozenBundle, request: ExecutionRequest, attempt: AttemptContext
    ) -> RunHandle:
        attempt_dir = self.work_dir / attempt.attempt_id
        try:
            copy_frozen(bundle.path, attempt_dir)
        except OSError as exc:
            raise LaunchError(
                FailureReason.STAGING_FAILED, f"staging into {attempt_dir}: {exc}"
            ) from exc
        env = {**os.environ, **attempt.env()}  # the job's own env is in job.json
        wrapper = attempt_dir / "scripts" / "orbit_wrapper.py"
        try:
            proc = subprocess.run(
                [sys.executable, str(wrapper), "--bundle", str(attempt_dir), "--detach"],
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise LaunchError(FailureReason.LAUNCH_FAILED, f"starting the wrapper: {exc}") from exc
        if proc.returncode != 0:
            detail = proc.stderr.strip() or _read(attempt_dir / "runtime" / "wrapper.err") or ""
            raise LaunchError(
                FailureReason.LAUNCH_FAILED, f"the runtime wrapper did not start: {detail[-500:]}"
            )
        return RunHandle(
            backend_key=self.key,
            target="localhost",
            attempt_id=attempt.attempt_id,
            location=str(attempt_dir),
            data={"pid": int(proc.stdout.strip() or 0)},
        )

    def status(self, handle: RunHandle) -> RunStatus:
        runtime = Path(handle.location) / "runtime"
        alive = wrapper_alive(runtime)
        result = parse_json(_read(runtime / "result.json"))
        status = parse_json(_read(runtime / "status.json"))
        found = status_from_files(status, result, alive)
        if found.reason is FailureReason.RUNTIME_LOST and status and status.get("task_pid"):
            pid = int(status["task_pid"])
            if _runs_attempt(pid, handle.attempt_id):  # never a stranger that reused the pid
                _kill_group(pid)  # no orphan task outlives its wrapper
        return found

    def read_log(self, handle: RunHandle, layer: LogLayer, offset: int) -> tuple[bytes, int]:
        path = Path(handle.location) / layer.relpath
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(READ_CHUNK)
        except FileNotFoundError:
            return b"", offset
        return data, offset + len(data)

    def read_file(self, handle: RunHandle, relpath: str) -> bytes | None:
        try:
            return (Path(handle.location) / relpath).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            return None

    def tail_files(self, handle: RunHandle, pattern: str, max_bytes: int) -> dict[str, bytes]:
        root = Path(handle.location)
        found = {}
        for path in sorted(root.glob(pattern)):
            if path.is_file() and not path.is_symlink():
                with open(path, "rb") as f:
                    f.seek(max(0, path.stat().st_size - max_bytes))
                    found[str(path.relative_to(root))] = f.read(max_bytes)
        return found

    def cancel(self, handle: RunHandle, reason: FailureReason) -> None:
        runtime = Path(handle.location) / "runtime"
        request = {"reason": reason.value, "at": datetime.now(UTC).isoformat()}
        (runtime / "stop_request.json").write_text(json.dumps(request) + "\n", encoding="utf-8")
        pid_text = _read(runtime / "pid")
        if pid_text and wrapper_alive(runtime):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_text), signal.SIGTERM)

    def collect(self, handle: RunHandle, dest: Path) -> CollectResult:
        source = Path(handle.location) / "artifacts"
        dest.mkdir(parents=True, exist_ok=True)
        files = size = 0
        for path in sorted(source.rglob("*")):
            if path.is_symlink() or not path.is_file():
                continue
            target = dest / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
            files += 1
            size += path.stat().st_size
        found, problems = verify_manifest(dest)
        return CollectResult(
            dest=dest,
            files=files,
            bytes=size,
            verified=found and not problems,
            problems=tuple(problems),
        )


def _runs_attempt(pid: int, attempt_id: str) -> bool:
    """Whether `pid` is still this attempt's task: its environment names the attempt."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, not ours to read, or no /proc: leave it alone
        return False
    return f"ORBIT_ATTEMPT_ID={attempt_id}".encode() in environ.split(b"\0")


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
