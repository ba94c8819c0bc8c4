"""`orbit logs`: a run's layered logs, or their live stream."""

from __future__ import annotations

import sys
import time
from collections import deque

import typer

from orbit.cli.common import ATTEMPT, RUN, err, service
from orbit.model.layers import LogLayer


def logs(
    run: str = RUN,
    follow: bool = typer.Option(
        False,
        "--follow",
        "-f",
        help="Keep printing until the run ends; then say how it ended (exit 1 unless it "
        "succeeded).",
    ),
    layer: LogLayer = typer.Option(
        LogLayer.TRAINING,
        "--layer",
        "-l",
        help="training: the task's output; runtime: the wrapper's own steps.",
    ),
    attempt: int | None = ATTEMPT,
    tail: int | None = typer.Option(
        None,
        "--tail",
        "-n",
        min=0,
        metavar="N",
        help="Only the last N lines of what is there now (then, with --follow, what comes).",
    ),
) -> None:
    """Print a run's logs. With --follow, stream them until the run ends (it follows retries)."""
    from orbit.model.backoff import follow_waits
    from orbit.model.errors import Unreachable

    svc = service()
    out = sys.stdout.buffer
    offset, current, lost = 0, None, False
    written = 0  # by the current read: a read broken off part way goes on from there
    last = LastLines(tail) if tail is not None else None  # until the first read has ended
    # jittered, growing waits (as the client's own resumes): many terminals following logs
    # through one host's outage do not all ask again in the same instant when it returns
    waits = follow_waits()

    def sink(data: bytes) -> None:
        nonlocal written
        if last is not None:
            last.add(data)
        else:
            out.write(data)
        written += len(data)

    while True:
        written = 0
        try:  # the rest of the log, streamed (over SSH: one call, not one per chunk)
            chunk = svc.stream_log(
                run, layer, offset, sink, attempt, only_attempt=current, follow=follow
            )
        except Unreachable as exc:
            offset += written
            if not follow:
                raise
            if not lost:  # say it once; go on from the same offset when the host is back
                err.print(f"orbit: {exc}; retrying (Ctrl-C stops following)")
                lost = True
            record = svc.refresh_run_status(run)
            asked = [a for a in record.attempts if a.number == attempt]
            followed = asked[0] if asked else record.current
            if followed.state.terminal and (attempt is not None or current in (None, followed.id)):
                break  # gave up on the host: it ended as host_unreachable
            time.sleep(waits.next())
            continue
        waits.reset()
        if lost:
            err.print("orbit: reconnected; the log goes on")
            lost = False
        if current is not None and chunk.attempt_id != current:  # an automatic retry began
            out.write(f"--- attempt {chunk.attempt} ---\n".encode())
            offset, current = 0, chunk.attempt_id
            continue
        current = chunk.attempt_id
        if last is not None:  # what was there has been read: its last lines, then live
            out.write(last.text())
            last = None
        out.flush()
        got, offset = chunk.offset != offset, chunk.offset
        if not follow:  # a read goes to the log's end: nothing more to ask for
            return
        if got:
            continue
        if chunk.ended:  # it had ended before this read: everything it wrote has been read
            record = svc.refresh_run_status(run)
            # the current attempt is followed into retries; an earlier one only to its own end
            if attempt is not None or record.current.id == current:
                break
            continue
        svc.refresh_run_status(run)
        time.sleep(0.5)
    ended(run, attempt)


class LastLines:
    """The last `n` lines of the bytes given (a line cut at the end counts as one), kept as
    they stream by: a long log is read through, never held whole."""

    def __init__(self, n: int) -> None:
        self.lines: deque[bytes] = deque(maxlen=n)
        self.n, self.partial = n, b""

    def add(self, data: bytes) -> None:
        *whole, self.partial = (self.partial + data).split(b"\n")
        self.lines.extend(line + b"\n" for line in whole)

    def text(self) -> bytes:
        if self.n == 0:
            return b""
        lines = [*self.lines, self.partial] if self.partial else list(self.lines)
        return b"".join(lines[-self.n :])


def ended(run: str, attempt: int | None) -> None:
    """After --follow: one line on stderr saying how the followed attempt ended; exit 1 unless
    it succeeded."""
    from orbit.cli import render

    record = service().get_run(run)
    followed = record.current
    if attempt is not None:
        followed = next(a for a in record.attempts if a.number == attempt)
    outcome = render.outcome(followed)
    err.print(
        f"orbit: {record.id} attempt {followed.number} {followed.state}"
        + (f": {outcome}" if outcome else ""),
    )
    if followed.state != "succeeded":
        raise typer.Exit(1)
