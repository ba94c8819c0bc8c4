"""Where to start reading a log for `orbit logs --tail N` and `--since WHEN`: a byte offset,
found by reading only the log's end (never the whole log) and, for --since, the times the
wrapper noted as the task's log grew (runtime/training.times) or the runtime log's own.
Reading then goes on from that offset as any other read does (and follows from there)."""

from __future__ import annotations

from datetime import datetime

from orbit.core.execution.backends.base import ExecutionBackend
from orbit.model.errors import InvalidInput
from orbit.model.layers import LogLayer
from orbit.model.models import RunHandle
from orbit.runtime import records

FIRST_LOOK = 64 * 1024  # --tail reads this much of the end first, four times more each time
MOST_LOOK = 64 * 1024 * 1024  # ... up to this: N lines longer than that start part way in one
RUNTIME_LOOK = 16 * 1024 * 1024  # the runtime log --since looks through (it is small)


def log_start(
    backend: ExecutionBackend,
    handle: RunHandle,
    layer: LogLayer,
    lines: int | None = None,
    since: datetime | None = None,
) -> int:
    """The offset at which a log's last `lines` lines of those written after `since` begin
    (either or both; neither: 0)."""
    start = 0
    if since is not None:
        start = _since(backend, handle, layer, since)
    if lines is not None:
        start = max(start, _last_lines(backend, handle, layer, lines))
    return start


def last_lines_at(data: bytes, n: int) -> int | None:
    """Where in `data` its last `n` lines begin (a line cut short at its end counts as one);
    None when it holds fewer than `n` whole ones before them."""
    if n == 0:
        return len(data)
    pos = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(n):
        pos = data.rfind(b"\n", 0, pos)
        if pos < 0:
            return None
    return pos + 1


def stamped_after(data: bytes, since: datetime) -> int:
    """Where in `data`, lines that begin with an ISO 8601 time (the runtime log's), the first
    one stamped after `since` begins; lines without a time go with the one before them."""
    pos = 0
    for line in data.splitlines(keepends=True):
        stamp = line.split(b" ", 1)[0].decode(errors="replace")
        try:
            at = datetime.fromisoformat(stamp)
        except ValueError:
            at = None
        if at is not None and at.tzinfo is not None and at > since:
            return pos
        pos += len(line)
    return len(data)


def _last_lines(backend: ExecutionBackend, handle: RunHandle, layer: LogLayer, n: int) -> int:
    look = FIRST_LOOK
    while True:
        data, end = backend.read_log_end(handle, layer, look)
        begin = end - len(data)
        found = last_lines_at(data, n)
        if found is not None:
            return begin + found
        if begin == 0 or look >= MOST_LOOK:
            return begin
        look *= 4


def _since(backend: ExecutionBackend, handle: RunHandle, layer: LogLayer, since: datetime) -> int:
    if layer is LogLayer.RUNTIME:
        data, end = backend.read_log_end(handle, layer, RUNTIME_LOOK)
        return end - len(data) + stamped_after(data, since)
    times = backend.read_file(handle, records.TIMES_RELPATH)
    if times is None:
        if backend.read_log_end(handle, layer, 0)[1] == 0:
            return 0  # nothing written yet
        raise InvalidInput(
            "since: this attempt's training log has no times (its bundle was made before "
            "ORBIT noted them); read its end by lines instead (orbit logs --tail N)"
        )
    offset = records.offset_at(times, since)
    if offset == 0:
        return 0
    # the size noted may fall inside a line (a task's output arrives in blocks): start at the
    # next line, as a line begun before `since` was written before it
    data, _ = backend.read_log(handle, layer, offset - 1)
    newline = data.find(b"\n")
    return offset if newline <= 0 else offset + newline
