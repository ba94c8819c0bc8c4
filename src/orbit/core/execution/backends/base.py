"""The one protocol every backend keeps. A backend holds no live connection between calls:
it reconstructs an attempt's state from the bundle's runtime/ files each time."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from orbit.model.layers import LogLayer as LogLayer
from orbit.model.models import ExecutionRequest, FailureReason, RunHandle, RunStatus
from orbit.model.records import CollectResult

if TYPE_CHECKING:
    from orbit.core.execution.bundle import FrozenBundle


@dataclass(frozen=True)
class AttemptContext:
    """Who the attempt is. Reaches the task as environment at launch, never the bundle."""

    run_id: str
    attempt_id: str
    # where the scheduler placed it (agent pools): node_id, node, gpus, gpu_share_gb,
    # gpu_gb (each GPU's memory), cpus, memory_gb
    placement: dict[str, Any] | None = None
    # an earlier attempt's checkpoint, staged on the node at `resume_staged`, to go to
    # `resume_relpath` under this attempt's artifacts (the wrapper moves it: ORBIT_RESUME_FROM)
    resume_staged: str | None = None
    resume_relpath: str | None = None
    # the model servers the node advertises (orbit agent --service): name -> URL
    services: dict[str, str] | None = None
    # one node of a gang (num_nodes > 1): rank, num_nodes, master_addr, master_port
    gang: dict[str, Any] | None = None
    # the GPUs the scheduler gave it on an SSH host it overflowed to (an agent sets its own)
    gpus: tuple[int, ...] | None = None
    # env name -> value of the run's secrets (core/control/secrets.py deliver): handed to the
    # wrapper on its stdin or in a file it reads and deletes, never in env() or on a command
    # line; never shown (repr)
    secrets: dict[str, str] = field(default_factory=dict, repr=False)

    def env(self) -> dict[str, str]:
        env = {"ORBIT_RUN_ID": self.run_id, "ORBIT_ATTEMPT_ID": self.attempt_id}
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = env["ORBIT_GPUS"] = ",".join(map(str, self.gpus))
        if self.gang:
            env["ORBIT_NODE_RANK"] = str(self.gang["rank"])
            env["ORBIT_NUM_NODES"] = str(self.gang["num_nodes"])
            env["ORBIT_MASTER_ADDR"] = str(self.gang["master_addr"])
            env["ORBIT_MASTER_PORT"] = str(self.gang["master_port"])
        if self.services:
            env["ORBIT_SERVICES"] = json.dumps(self.services, sort_keys=True)
        if self.resume_staged and self.resume_relpath:
            env["ORBIT_RESUME_STAGED"] = self.resume_staged
            env["ORBIT_RESUME_RELPATH"] = self.resume_relpath
        return env


def attempt_env(
    bundle: FrozenBundle, request: ExecutionRequest, attempt: AttemptContext
) -> dict[str, str]:
    """What every launch gives the wrapper in its environment: the attempt's own (above), and
    where it came from, which the wrapper writes into runtime/last_run.json and
    artifacts/manifest.json, so that a bundle or a collected folder tells its run without the
    store. Informational: the task sees them too."""
    env = {
        **attempt.env(),
        "ORBIT_BUNDLE_DIGEST": bundle.digest,
        "ORBIT_TEMPLATE": request.template_id,
        "ORBIT_BACKEND": request.backend_key,
    }
    if request.target:
        env["ORBIT_TARGET"] = request.target
    return env


class LaunchError(Exception):
    """Staging or starting failed: an infrastructure failure with its reason."""

    def __init__(self, reason: FailureReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class NoNodeFree(LaunchError):
    """No node can take the attempt right now: it waits (prepared, with this message) and is
    placed when one can. Not a failure: the reason is only what it would be filed under."""

    def __init__(self, message: str, room_elsewhere: bool = False) -> None:
        super().__init__(FailureReason.LAUNCH_FAILED, message)
        # a node has a free slot this attempt cannot use: one waiting behind it may
        self.room_elsewhere = room_elsewhere


class ExecutionBackend(Protocol):
    key: str

    def validate(self, request: ExecutionRequest) -> None:
        """Refuse (orbit.model.errors.OrbitError) what this backend cannot run, before anything
        is written."""

    def launch(
        self, bundle: FrozenBundle, request: ExecutionRequest, attempt: AttemptContext
    ) -> RunHandle:
        """Stage the bundle and start it detached; raise LaunchError if it did not start."""
        ...

    def locate(self, request: ExecutionRequest, attempt: AttemptContext) -> RunHandle | None:
        """Where an attempt of this request was launched, for one whose launching process died
        before the store recorded it; None when its folder was never made there (it never
        started). May contact the host (raises Unreachable when it does not answer)."""
        ...

    def status(self, handle: RunHandle) -> RunStatus: ...

    def read_log(self, handle: RunHandle, layer: LogLayer, offset: int) -> tuple[bytes, int]:
        """Bytes of a log from `offset`, and the offset to ask from next time."""
        ...

    def read_log_end(self, handle: RunHandle, layer: LogLayer, max_bytes: int) -> tuple[bytes, int]:
        """The last `max_bytes` of a log, and its size then (the offset they end at); a log
        not written yet reads as (b"", 0)."""
        ...

    def read_file(self, handle: RunHandle, relpath: str) -> bytes | None:
        """A whole file of the attempt's bundle (runtime/precheck.json, ...), None if absent."""
        ...

    def read_range(
        self, handle: RunHandle, relpath: str, offset: int, limit: int
    ) -> tuple[bytes, int]:
        """At most `limit` bytes of a file of the attempt's folder from `offset`, and the file's
        size (a chart zoomed into an hour of a day-long NVML audit); a missing file reads as
        (b"", 0)."""
        ...

    def tail_files(self, handle: RunHandle, pattern: str, max_bytes: int) -> dict[str, bytes]:
        """The last `max_bytes` of every file matching a glob relative to the bundle."""
        ...

    def cancel(self, handle: RunHandle, reason: FailureReason) -> None:
        """Ask the wrapper to stop the task gracefully (it kills after the grace period)."""

    def collect(self, handle: RunHandle, dest: Path) -> CollectResult: ...


# --- optional abilities -----------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessSweep:
    """What a sweep of ended attempts' processes on a host stopped: attempt id -> pids."""

    stopped: dict[str, tuple[int, ...]] = field(default_factory=dict)
    errors: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return sum(len(pids) for pids in self.stopped.values())


@runtime_checkable
class StopsLeftovers(Protocol):
    """A backend that can stop what still runs of an attempt that has ended (its processes
    carry the attempt's ORBIT_ATTEMPT_ID): `orbit cancel` of an ended run."""

    def stop_leftovers(self, handle: RunHandle) -> int:
        """SIGTERM, then SIGKILL after the grace period; how many processes were stopped."""
        ...


@runtime_checkable
class SweepsEndedProcesses(Protocol):
    """A backend whose hosts outlive the control plane's contact with them: on the host where
    `handle` ran, it stops the processes of this control plane's attempts not in `live`."""

    def sweep_processes_near(self, handle: RunHandle, live: set[str]) -> ProcessSweep: ...


@runtime_checkable
class KnowsUnplaced(Protocol):
    """A backend whose launch has one effect, a fenced store transaction (an agent pool's
    placement): it can tell that an attempt was never placed anywhere, which a dead launcher's
    attempt may then be launched again without ever starting twice. (On a host, a launcher
    that only looks dead may still be staging there: such an attempt is ended instead.)"""

    def never_placed(self, attempt: AttemptContext) -> bool: ...


# how a collect's files reach its destination: copy_artifacts(source, dest, skip=...)
CopyArtifacts = Callable[..., CollectResult]


@runtime_checkable
class CollectsInPlace(Protocol):
    """A backend whose attempts' files may be on the control plane's own disk (this
    machine's attempts, an agent pool's copy, a Slurm cluster whose filesystem is here).
    `collect_in_place` gathers them as collect would (asking a node for what it holds back,
    say), but hands each folder to `copy` with where it goes under the destination (`.` for
    the top), so that a server serves collect from where the files are, with no second copy.
    None: this attempt's files are elsewhere (collect copies them here)."""

    def collect_in_place(self, handle: RunHandle, copy: CopyArtifacts) -> CollectResult | None: ...


LogSink = Callable[[bytes], object]


@runtime_checkable
class StreamsLogs(Protocol):
    """A backend that sends the rest of a log in one transfer (over SSH: one ssh call), where
    read_log's chunks would each cost a round trip."""

    def stream_log(self, handle: RunHandle, layer: LogLayer, offset: int, sink: LogSink) -> int:
        """Every byte of the log from `offset` to its current end, given to `sink` as it
        arrives; the offset to ask from next time. If it fails part way (Unreachable), what
        `sink` got was delivered: the caller goes on from `offset` plus that."""
        ...


def stream_log(
    backend: ExecutionBackend, handle: RunHandle, layer: LogLayer, offset: int, sink: LogSink
) -> int:
    """The rest of a log into `sink`, streamed where the backend can, else read_log's chunks."""
    if isinstance(backend, StreamsLogs):
        return backend.stream_log(handle, layer, offset, sink)
    while True:
        data, offset = backend.read_log(handle, layer, offset)
        if not data:
            return offset
        sink(data)
