"""Where the control plane keeps its one copy of each attempt's files, and gathering that copy
for a collect served over HTTP (orbit.core.storage.wire sends it from where it is).

A local attempt's copy is its own folder in $ORBIT_HOME/work/; an agent pool attempt's is the
copy its agent uploads into $ORBIT_HOME/artifacts/; an attempt elsewhere (an SSH host, a
Slurm cluster reached over SSH) has none until a collect brings its artifacts into
$ORBIT_HOME/artifacts/ATTEMPT/artifacts/, incrementally, and serves them from there. Nothing
else is kept: a collect over HTTP never copies the files a second time on the server."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orbit.core.execution.backends.base import CollectsInPlace, ExecutionBackend
from orbit.core.storage.wire import Held
from orbit.model.errors import Unreachable
from orbit.model.models import RunHandle


@dataclass(frozen=True)
class Places:
    """The control plane's folders under $ORBIT_HOME."""

    home: Path

    @property
    def work(self) -> Path:
        return self.home / "work"

    @property
    def artifacts(self) -> Path:
        return self.home / "artifacts"

    @property
    def bundles(self) -> Path:
        return self.home / "bundles"

    @property
    def archives(self) -> Path:
        return self.home / "bundle-archives"

    @property
    def inputs_index(self) -> Path:
        """Which inputs each user sent, by digest, and the bundle holding them (see
        orbit.server.input_sets): one folder per user, one file per digest."""
        return self.home / "inputs-index"

    @property
    def old_cache(self) -> Path:
        """Where collects over HTTP once kept a second copy of every attempt (gc removes it)."""
        return self.home / "collected"

    def attempt_copy(self, attempt_id: str, backend_key: str) -> Path:
        """The attempt's folder on the control plane (which may not exist)."""
        return (self.work if backend_key.startswith("local_") else self.artifacts) / attempt_id


def gather(
    backend: ExecutionBackend, handle: RunHandle, places: Places, attempt_id: str
) -> tuple[Held, bool]:
    """The attempt's copy as a collect would leave it (a node asked for what it held back, an
    SSH host's artifacts brought in), and whether that changed the copy here."""
    held = Held()
    if isinstance(backend, CollectsInPlace):
        result = backend.collect_in_place(handle, held.note)
        if result is not None:
            held.problems = list(result.problems)
            return held, False
        held.roots.clear()
    base = places.artifacts / attempt_id / "artifacts"
    held.roots = [("", base)]
    try:
        result = backend.collect(handle, base)
    except Unreachable as exc:
        if not base.is_dir():
            raise
        held.problems = [f"{exc} (sent: what an earlier collect brought to the server)"]
        return held, False
    held.problems = list(result.problems)
    return held, True
