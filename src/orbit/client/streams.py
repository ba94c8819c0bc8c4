"""The API's two long answers, read as streams that outlast a cut connection: a run's log
(Server-Sent Events, asked for again from the last event's offset) and its artifacts (a tar
stream into orbit.client.collect's Destination, which goes on where a cut transfer stopped)."""

from __future__ import annotations

import base64
import json
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from orbit.client.meter import QUIET, Meter

# orbit.client.session first: it spares httpx its command line's imports (see there)
from orbit.client.session import API, Session, part, query, raise_for

# isort: split
import httpx

from orbit.core.control.views import LogChunk
from orbit.model.backoff import follow_waits
from orbit.model.errors import BY_NAME, ServerError, Unreachable
from orbit.model.layers import LogLayer
from orbit.model.records import CollectResult

RESUMES = 20  # a log stream broken off this many times in a row is given up on


def stream_log(
    session: Session,
    ref: str,
    layer: LogLayer,
    offset: int,
    sink: Callable[[bytes], None],
    attempt: int | None = None,
    only_attempt: str | None = None,
    follow: bool = False,
) -> LogChunk:
    """The log as Server-Sent Events from `offset`. A stream broken off is asked for again
    from the last event's id (its byte offset), so nothing is lost or repeated."""
    params = query({"offset": offset, "attempt": attempt, "only_attempt": only_attempt})
    params["follow"] = "true" if follow else "false"
    path = f"{API}/runs/{part(ref)}/logs/{layer.value}"
    broken = 0
    # jittered waits (mean about 2 s once grown): RESUMES of them ride out a restart of
    # half a minute, and the followers a restart cut off do not all come back at once
    waits = follow_waits()
    while True:
        headers = {"Accept": "text/event-stream", "Last-Event-ID": str(offset)}
        try:
            with session.http.stream(
                "GET", path, params={**params, "offset": str(offset)}, headers=headers
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise_for(response)
                for event, data in _events(response.iter_lines()):
                    broken = 0
                    waits.reset()
                    if event == "log":
                        piece = base64.b64decode(data)
                        sink(piece)
                        offset += len(piece)
                    elif event == "end":
                        end = json.loads(data)
                        return LogChunk(data=b"", **end)
                    elif event == "error":  # the server hit a problem once streaming
                        problem = json.loads(data)
                        cls = BY_NAME.get(str(problem.get("error")), ServerError)
                        raise cls(str(problem.get("detail")))
        except (httpx.TransportError, httpx.DecodingError) as exc:
            broken += 1
            if broken > RESUMES:
                raise session.unreachable(exc) from None
            time.sleep(waits.next())
            continue
        # the stream ended without its `end` event: a proxy cut it; go on from here
        broken += 1
        if broken > RESUMES:
            raise ServerError(f"{session.url}: the log stream keeps ending early")


def collect_artifacts(
    session: Session, ref: str, dest: Path, attempt: int | None = None, meter: Meter = QUIET
) -> CollectResult:
    """Only what `dest` lacks comes: the server compares what is there (path, size,
    sha256) with its copy and sends the rest, going on from where a cut transfer
    stopped (told to `meter` as it arrives); then each rank's files are checked against
    its manifest (see orbit.client.collect)."""
    from orbit.client.collect import Destination

    here = Destination(dest)
    have, partial = here.have()
    body = {
        "attempt": attempt,
        "have": [h.model_dump() for h in have],
        "partial": [p.model_dump() for p in partial],
    }
    path = f"{API}/runs/{part(ref)}/artifacts"
    try:
        with session.http.stream("POST", path, json=body) as resp:
            if resp.status_code >= 400:
                resp.read()
                raise_for(resp)
            summary = json.loads(resp.headers.get("x-orbit-collect", "{}"))
            dest.mkdir(parents=True, exist_ok=True)
            try:
                with meter.track("collecting artifacts", int(summary.get("moved", 0))) as tick:
                    here.receive(_Reader(resp.iter_bytes()), tick)
            finally:
                here.save()  # what arrived is known next time, however this ends
    except (httpx.TransportError, tarfile.ReadError) as exc:
        raise Unreachable(
            f"the transfer from {session.url} was cut after {here.moved:,} bytes ({exc}); run "
            "the same collect again: it goes on from there"
        ) from None
    return here.result(summary)


def _events(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    """Server-Sent Events: (event, data) for each event; comments and ids are skipped (the
    offset travels in the data's length and the `end` event)."""
    event, data = "message", list[str]()
    for line in lines:
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", list[str]()
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)


class _Reader:
    """A file to read from an iterator of byte blocks (a response's body, for tarfile's
    stream mode)."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self.blocks = blocks
        self.buffer = bytearray()

    def read(self, size: int = -1, /) -> bytes:
        while size < 0 or len(self.buffer) < size:
            block = next(self.blocks, None)
            if block is None:
                break
            self.buffer += block
        size = len(self.buffer) if size < 0 else min(size, len(self.buffer))
        out = bytes(self.buffer[:size])
        del self.buffer[:size]  # from the front: cheap for a bytearray
        return out
