"""Reading an attempt's folder that lies on this machine, at its handle's location: the local
backends' own attempts, and the control plane's copy of a pool node's attempt."""

from __future__ import annotations

from pathlib import Path

from orbit.core.execution.backends.base import LogLayer
from orbit.model.models import RunHandle
from orbit.runtime import hostside

READ_CHUNK = 1 << 20  # the most of a log one read returns (logs -f reads on from there)


class LocalFiles:
    """The reads of the ExecutionBackend protocol over a folder on this machine."""

    def read_log(self, handle: RunHandle, layer: LogLayer, offset: int) -> tuple[bytes, int]:
        data = hostside.read_from(str(Path(handle.location) / layer.relpath), offset, READ_CHUNK)
        return data or b"", offset + len(data or b"")

    def read_log_end(self, handle: RunHandle, layer: LogLayer, max_bytes: int) -> tuple[bytes, int]:
        return hostside.read_end(str(Path(handle.location) / layer.relpath), max_bytes)

    def read_file(self, handle: RunHandle, relpath: str) -> bytes | None:
        return hostside.read_from(str(Path(handle.location) / relpath), 0, -1)

    def read_range(
        self, handle: RunHandle, relpath: str, offset: int, limit: int
    ) -> tuple[bytes, int]:
        return hostside.read_range(str(Path(handle.location) / relpath), offset, limit)

    def tail_files(self, handle: RunHandle, pattern: str, max_bytes: int) -> dict[str, bytes]:
        return hostside.tail(handle.location, pattern, max_bytes)
