"""`orbit logs`: a run's layered logs, or their live stream."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime

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
        help="Only the last N lines of what is there now (then, with --follow, what comes). "
        "Only the log's end is read, however long the log.",
    ),
    since: str | None = typer.Option(
        None,
        "--since",
        metavar="WHEN",
        help="Only what was written after WHEN: a duration back from now (90s, 10m, 2h, 1d) "
        "or a time (2026-05-01T12:00:00Z; without a zone, this machine's). The task's own "
        "output carries no times: ORBIT notes the log's size every second as it grows, so "
        "this is to within a second of when the output reached the log (a task that holds "
        "its output back writes in bursts). With --tail, the last N of those lines.",
    ),
) -> None:
    """Print a run's logs. With --follow, stream them until the run ends (it follows retries).

    \b
    orbit logs RUN --tail 50              the last 50 lines
    orbit logs RUN --since 10m -f         the last ten minutes, then follow
    orbit logs RUN -l runtime --since 1h  the wrapper's own steps of the last hour"""
    from orbit.model.backoff import follow_waits
    from orbit.model.errors import Unreachable

    svc = service()
    out = sys.stdout.buffer
    offset, current, lost = 0, None, False
    if tail is not None or since is not None:
        when = since_time(since) if since is not None else None
        place = svc.find_log_start(run, layer, lines=tail, since=when, attempt=attempt)
        offset, current = place.offset, place.attempt_id
    written = 0  # by the current read: a read broken off part way goes on from there
    # jittered, growing waits (as the client's own resumes): many terminals following logs
    # through one host's outage do not all ask again in the same instant when it returns
    waits = follow_waits()

    def sink(data: bytes) -> None:
        nonlocal written
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


def since_time(text: str) -> datetime:
    """--since: a duration back from now (as `orbit tokens --expires` takes them) or an ISO
    8601 time (this machine's zone where it names none)."""
    from orbit.model.durations import parse_duration
    from orbit.model.errors import InvalidInput

    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        try:
            return datetime.now(UTC) - parse_duration(text, "--since")
        except InvalidInput:
            raise InvalidInput(
                f"--since: expected a duration like 90s, 10m or 2h, or a time like "
                f"2026-05-01T12:00:00Z, got {text!r}"
            ) from None
    return when if when.tzinfo is not None else when.astimezone()


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
