"""`ssh_host_process`: the attempt runs detached on a registered SSH host.

The bundle is staged by digest (see orbit.core.execution.ssh.transfer: an unchanged bundle
moves nothing). Each attempt gets its own copy under attempts/ATTEMPT_ID/ and its wrapper starts
in a new session; the SSH connection ends there. Status is rebuilt each time from runtime/ files
read over SSH.
"""

from __future__ import annotations

import base64
import contextlib
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from orbit.core.execution.backends.base import (
    AttemptContext,
    LaunchError,
    LogLayer,
    LogSink,
    ProcessSweep,
    attempt_env,
)
from orbit.core.execution.backends.local_files import READ_CHUNK
from orbit.core.execution.runtime_state import parse_json, status_from_files
from orbit.core.execution.ssh.hosts import check_request
from orbit.core.execution.ssh.transport import Ssh, SshOptions, last_line
from orbit.model.errors import OrbitError, Refused, Unreachable
from orbit.model.hosts import HostRecord, HostSpec
from orbit.model.models import ExecutionRequest, FailureReason, RunHandle, RunState, RunStatus

if TYPE_CHECKING:  # launching and collecting load the transfer code; looking at a run does not
    from orbit.core.execution.bundle import FrozenBundle
    from orbit.model.records import CollectResult


DOWN_MEMORY_S = 30.0  # within one command, a host that did not answer is not asked again
SWEEP_TIMEOUT_S = 90.0  # a stop there waits at most host_processes.MAX_GRACE_S for a graceful end
LIVE_IDS_PER_ARG = 2000


class HostDirectory(Protocol):
    """What the SSH backends ask the control plane about hosts (the store's host table)."""

    def find(self, name: str) -> HostRecord | None: ...

    def active_attempts(self, name: str | None = None) -> set[str]: ...


class NoHosts:
    """A control plane without a host registry: no target is a registered host."""

    def find(self, name: str) -> HostRecord | None:
        return None

    def active_attempts(self, name: str | None = None) -> set[str]:
        return set()


def _decode(value: Any) -> bytes | None:
    return None if value is None else base64.b64decode(value)


class SshHostProcessBackend:
    key = "ssh_host_process"

    def __init__(self, hosts: HostDirectory, options: SshOptions, plane: str = "") -> None:
        self.hosts = hosts
        self.options = options
        self.plane = plane  # this control plane, as the containers' label says (docker)
        self._down: dict[str, tuple[float, str]] = {}  # host -> (when, why) it did not answer

    def launch_env(self) -> dict[str, str]:
        """More environment for the wrapper: which control plane started it, so that a sweep
        of ended attempts' processes never touches another's (several may share a host)."""
        return {"ORBIT_PLANE": self.plane} if self.plane else {}

    # --- before the store is written ------------------------------------------------------

    def host(self, target: str | None, template_id: str) -> HostRecord:
        if not target:
            raise Refused(
                f"template '{template_id}' runs on a registered SSH host: give one with "
                "--set target=NAME (see 'orbit hosts list'; add one with 'orbit hosts add')"
            )
        found = self.hosts.find(target)
        if found is None:
            raise Refused(
                f"target '{target}' is not a registered host (see 'orbit hosts list'; "
                f"add it with 'orbit hosts add {target} --ssh USER@ADDRESS')"
            )
        return found

    def validate(self, request: ExecutionRequest) -> None:
        check_request(self.host(request.target, request.template_id), request)

    # --- launch ---------------------------------------------------------------------------

    def launch(
        self, bundle: FrozenBundle, request: ExecutionRequest, attempt: AttemptContext
    ) -> RunHandle:
        """Stage, copy into the attempt's folder, start. Until the start is asked for, a
        failure is certain: nothing runs. If the host stops answering while the start is
        under way, the attempt may have started: it is recorded at its known location, and
        the next status probe tells (a wrapper that never started reads as runtime_lost)."""
        from orbit.core.execution.ssh.transfer import stage_bundle

        host = self.host(request.target, request.template_id)  # refused: launch_failed
        swept = ProcessSweep()
        with contextlib.suppress(OrbitError):  # the host's next contact; never stops a launch
            swept = self.sweep_processes(host, self.hosts.active_attempts())
        ssh = Ssh(host.spec, self.options)
        launch = {**attempt_env(bundle, request, attempt), **self.launch_env()}
        env = [f"{k}={v}" for k, v in launch.items()]
        try:
            try:
                staged = stage_bundle(ssh, bundle)
                prepared = ssh.hostside(
                    "prepare", staged["work"], bundle.digest, attempt.attempt_id, timeout=3600
                )
            except Unreachable as exc:
                raise LaunchError(FailureReason.HOST_UNREACHABLE, str(exc)) from exc
            except OrbitError as exc:
                raise LaunchError(FailureReason.STAGING_FAILED, str(exc)) from exc
            if "error" in prepared:
                raise LaunchError(
                    FailureReason.STAGING_FAILED, f"host '{host.name}': {prepared['error']}"
                )
            location = str(prepared["location"])
            try:
                started = ssh.hostside("launch", location, *env, secrets=attempt.secrets)
            except Unreachable as exc:
                started = {"uncertain": str(exc)}
            except OrbitError as exc:
                raise LaunchError(FailureReason.LAUNCH_FAILED, str(exc)) from exc
        finally:
            with contextlib.suppress(OSError, subprocess.SubprocessError, OrbitError):
                ssh.close()
        if "error" in started:
            raise LaunchError(
                FailureReason.LAUNCH_FAILED, f"host '{host.name}': {started['error']}"
            )
        return RunHandle(
            backend_key=self.key,
            target=host.name,
            attempt_id=attempt.attempt_id,
            location=location,
            data={
                "host": host.spec.model_dump(mode="json"),  # found again if the host is removed
                "pid": started.get("pid"),
                "launch_uncertain": started.get("uncertain"),
                "work_dir": staged["work"],
                "staged_bytes": staged["sent"],
                "staged_wire_bytes": staged["wire"],
                "bundle_cached": staged["cached"],
                # ended attempts' processes the sweep before this launch stopped, for the audit
                **({"processes_stopped": swept.stopped} if swept.stopped else {}),
            },
        )

    # --- an attempt that was launched ----------------------------------------------------

    def _hostside(
        self, handle: RunHandle, *args: str, timeout: float | None = None
    ) -> dict[str, Any]:
        """A hostside call for a launched attempt. Any failure to get an answer (a refused
        key or a changed host key included) is Unreachable: the run is not lost for it."""
        try:
            found = self._ssh(handle).hostside(*args, timeout=timeout)
        except OrbitError as exc:
            self._down[handle.target] = (time.monotonic(), str(exc))
            raise Unreachable(str(exc)) from exc
        self._down.pop(handle.target, None)
        return found

    def _ssh(self, handle: RunHandle) -> Ssh:
        """The host as registered now (its address may have changed since the launch), else
        as it was at the launch."""
        current = self.hosts.find(handle.target)
        if current is not None:
            return Ssh(current.spec, self.options)
        return Ssh(HostSpec.model_validate(handle.data["host"]), self.options)

    def locate(self, request: ExecutionRequest, attempt: AttemptContext) -> RunHandle | None:
        host = self.host(request.target, request.template_id)
        handle = RunHandle(
            backend_key=self.key,
            target=host.name,
            attempt_id=attempt.attempt_id,
            location="",
            data={"host": host.spec.model_dump(mode="json")},
        )
        work = str(self._hostside(handle, "stage-check", host.spec.work_dir, "-")["work"])
        location = f"{work}/attempts/{attempt.attempt_id}"
        if self._hostside(handle, "probe", location, attempt.attempt_id).get("missing"):
            return None
        return handle.model_copy(
            update={"location": location, "data": {**handle.data, "work_dir": work}}
        )

    def status(self, handle: RunHandle) -> RunStatus:
        # one command asks a dead host once: `runs list` with ten runs on it must not wait for
        # ten connect timeouts
        down = self._down.get(handle.target)
        if down is not None and time.monotonic() - down[0] < DOWN_MEMORY_S:
            raise Unreachable(down[1])
        found = self._hostside(handle, "probe", handle.location, handle.attempt_id)
        if found.get("missing"):
            return RunStatus(
                state=RunState.FAILED,
                reason=FailureReason.RUNTIME_LOST,
                message=f"{handle.location} is gone from host '{handle.target}'",
            )
        if "error" in found:
            raise Unreachable(f"host '{handle.target}': {found['error']}")
        return status_from_files(
            parse_json(found.get("status")),
            parse_json(found.get("result")),
            bool(found.get("alive")),
        )

    def read_log(self, handle: RunHandle, layer: LogLayer, offset: int) -> tuple[bytes, int]:
        found = self._hostside(
            handle, "read", f"{handle.location}/{layer.relpath}", str(offset), str(READ_CHUNK)
        )
        data = _decode(found.get("data")) or b""
        return data, offset + len(data)

    def read_log_end(self, handle: RunHandle, layer: LogLayer, max_bytes: int) -> tuple[bytes, int]:
        path = f"{handle.location}/{layer.relpath}"
        found = self._hostside(handle, "read-end", path, str(max_bytes))
        return _decode(found.get("data")) or b"", int(found.get("end") or 0)

    def stream_log(self, handle: RunHandle, layer: LogLayer, offset: int, sink: LogSink) -> int:
        """The rest of the log: up to a chunk over the shared connection (read_log), and
        what lies past that in one more ssh call (`tail -c +N`, its bytes as they are), where
        read_log would take one call per chunk, base64 in JSON. That call has a connection of
        its own (a log's bulk is faster so), which a log's end, a tail or a followed log's
        next lines do not wait for."""
        data, after = self.read_log(handle, layer, offset)
        if data:
            sink(data)
        if len(data) < READ_CHUNK:
            return after
        offset, count = after, 0

        def counted(data: bytes) -> None:
            nonlocal count
            count += len(data)
            sink(data)

        path = f"{handle.location}/{layer.relpath}"
        try:
            code, stderr = self._ssh(handle).stream(["tail", "-c", f"+{offset + 1}", path], counted)
        except OrbitError as exc:  # as _hostside: a run is not lost for a missed answer
            self._down[handle.target] = (time.monotonic(), str(exc))
            raise Unreachable(str(exc)) from exc
        self._down.pop(handle.target, None)
        if code != 0 and not count and "No such file" not in stderr:
            raise OrbitError(
                f"host '{handle.target}': reading {layer.relpath} failed (exit {code}: "
                f"{last_line(stderr) or 'no message'})"
            )
        return offset + count  # a log not written yet reads as empty, as read_log's

    def read_file(self, handle: RunHandle, relpath: str) -> bytes | None:
        found = self._hostside(
            handle, "read", f"{handle.location}/{relpath}", "0", str(64 * READ_CHUNK)
        )
        return _decode(found.get("data"))

    def read_range(
        self, handle: RunHandle, relpath: str, offset: int, limit: int
    ) -> tuple[bytes, int]:
        path = f"{handle.location}/{relpath}"
        found = self._hostside(handle, "read-range", path, str(offset), str(limit))
        return _decode(found.get("data")) or b"", int(found.get("size") or 0)

    def tail_files(self, handle: RunHandle, pattern: str, max_bytes: int) -> dict[str, bytes]:
        found = self._hostside(handle, "tail", handle.location, pattern, str(max_bytes))
        return {k: _decode(v) or b"" for k, v in dict(found.get("files") or {}).items()}

    def cancel(self, handle: RunHandle, reason: FailureReason) -> None:
        self._hostside(handle, "cancel", handle.location, reason.value)

    # --- what is left of ended attempts ---------------------------------------------------

    def stop_leftovers(self, handle: RunHandle) -> int:
        found = self._hostside(
            handle, "stop-attempt", handle.location, handle.attempt_id, timeout=SWEEP_TIMEOUT_S
        )
        if "error" in found:
            raise OrbitError(f"host '{handle.target}': {found['error']}")
        return len(found.get("stopped") or [])

    def sweep_processes(self, host: HostRecord, live: Iterable[str]) -> ProcessSweep:
        """Stop the processes of this control plane's attempts on the host that are not
        among the `live` ones (at `orbit hosts check` and before every launch there)."""
        return self._sweep(Ssh(host.spec, self.options), f"{host.spec.work_dir}/attempts", live)

    def sweep_processes_near(self, handle: RunHandle, live: set[str]) -> ProcessSweep:
        """The same sweep, on the host where `handle` ran (when it answers again after it
        did not: what was given up on meanwhile may still run there)."""
        work = handle.data.get("work_dir") or str(Path(handle.location).parent.parent)
        return self._sweep(self._ssh(handle), f"{work}/attempts", live)

    def _sweep(self, ssh: Ssh, attempts: str, live: Iterable[str]) -> ProcessSweep:
        if not self.plane:
            return ProcessSweep()  # which processes are ours is not known: touch none
        ids, chunks = sorted(live), []
        while ids:  # a few thousand ids an argument: none nears the system's limit
            chunks.append(",".join(ids[:LIVE_IDS_PER_ARG]))
            ids = ids[LIVE_IDS_PER_ARG:]
        found = ssh.hostside("stop-ended", attempts, self.plane, *chunks, timeout=SWEEP_TIMEOUT_S)
        if "error" in found:
            return ProcessSweep(errors=(f"host '{ssh.spec.name}': {found['error']}",))
        stopped = dict(found.get("stopped") or {})
        return ProcessSweep({str(a): tuple(int(p) for p in pids) for a, pids in stopped.items()})

    def collect(self, handle: RunHandle, dest: Path) -> CollectResult:
        """rsync artifacts/ here, incremental and resumable, each file verified against the
        manifest (see orbit.core.execution.ssh.transfer)."""
        from orbit.core.execution.ssh.transfer import collect_artifacts

        return collect_artifacts(self._ssh(handle), handle, dest)
