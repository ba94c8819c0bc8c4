"""/api/v1/runs/{ref}/logs/{layer}: a run's log as Server-Sent Events, from an offset, followed
while its attempt runs."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse

from orbit.core.control.base import attempt_of
from orbit.core.control.service import CoreControlService
from orbit.core.control.views import LogPlace
from orbit.model.errors import OrbitError
from orbit.model.layers import LogLayer
from orbit.model.records import AttemptRecord
from orbit.server.routes.common import RUN_REF, api_router, me

FOLLOW_S = 30.0  # a followed log stream ends after this long without the attempt ending: the
# client asks again from where it got to (proxies drop streams that stay open for long)
EVENT_BYTES = 16 * 1024  # the most log bytes one event carries (a cut stream loses at most one)
MAX_OFFSET = 2**63 - 1  # the largest offset a file can be read from
MAX_LINES = 10_000_000  # the most lines a log's end is asked for
MAX_FIELD = 1024 * 1024  # a submission's JSON fields; the whole request: limits.upload_bytes
# one event of a log stream (before OpenAPI 3.2, a stream's `schema` describes each event)
LOG_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"enum": ["log", "end"]},
        "id": {"type": "string", "description": "the log's byte offset after this event"},
        "data": {"type": "string", "description": "log: base64 bytes; end: a JSON object"},
    },
}


def make_logs_router(service: CoreControlService) -> APIRouter:
    router = api_router()

    # -- logs ------------------------------------------------------------------------------
    @router.get(
        "/runs/{ref}/logs/{layer}",
        tags=["logs"],
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {"schema": LOG_EVENT}}}},
    )
    def logs(
        who: me,
        ref: RUN_REF,
        layer: LogLayer,
        offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
        attempt: Annotated[int | None, Query(ge=1)] = None,
        only_attempt: Annotated[str | None, Query(max_length=64)] = None,
        follow: bool = False,
        last_event_id: Annotated[
            int | None, Header(ge=0, le=MAX_OFFSET, description="resume here (wins over offset)")
        ] = None,
    ) -> StreamingResponse:
        """A log as Server-Sent Events: `log` events carry base64 bytes, each with the byte
        offset after them as its id (send it back as Last-Event-ID to go on from there); an
        `end` event says where the log stands (offset, attempt, whether it had ended). With
        `follow`, the stream stays open while the attempt runs (up to 30 s a request)."""
        if last_event_id is not None:
            offset = last_event_id
        # an unknown run or attempt is a 404 now, not a stream that breaks off once begun
        run = service.get_run(ref)
        found = attempt_of(run, attempt)
        # the stream stays with one attempt, whatever comes after; if a retry began since the
        # caller's last read (only_attempt is no longer current), it only says which
        began = attempt is None and only_attempt not in (None, found.id)
        pinned = None if began else found.number
        return StreamingResponse(
            _log_events(service, run.id, layer, offset, found, pinned, follow),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    @router.get("/runs/{ref}/logs/{layer}/start", tags=["logs"])
    def log_start(
        who: me,
        ref: RUN_REF,
        layer: LogLayer,
        lines: Annotated[int | None, Query(ge=0, le=MAX_LINES)] = None,
        since: Annotated[
            datetime | None, Query(description="ISO 8601 with its zone, as 2026-05-01T12:00:00Z")
        ] = None,
        attempt: Annotated[int | None, Query(ge=1)] = None,
    ) -> LogPlace:
        """Where a log's last `lines` lines, of those written after `since`, begin (either or
        both): stream the log from that offset (`orbit logs --tail N --since WHEN`). Only the
        log's end is read to find it."""
        return service.find_log_start(ref, layer, lines=lines, since=since, attempt=attempt)

    return router


async def _log_events(
    service: CoreControlService,
    ref: str,
    layer: LogLayer,
    offset: int,
    found: AttemptRecord,
    pinned: int | None,
    follow: bool,
) -> AsyncIterator[str]:
    """The events of one log stream (see the `logs` route): the bytes of attempt `pinned`
    from `offset`, or, with none pinned, only the `end` event naming the current attempt.
    Reads run in the thread pool, the waits between them do not hold a thread; an error once
    the stream began is an `error` event with the problem's detail."""
    if pinned is None:
        yield _end(offset, found.number, found.id, found.state.terminal)
        return
    deadline = time.monotonic() + FOLLOW_S
    quiet_since = time.monotonic()
    while True:
        try:
            chunk = await anyio.to_thread.run_sync(
                functools.partial(service.read_log, ref, layer, offset, pinned)
            )
        except OrbitError as exc:
            problem = {"detail": str(exc), "error": type(exc).__name__}
            yield f"event: error\ndata: {json.dumps(problem)}\n\n"
            return
        if chunk.data:
            for start in range(0, len(chunk.data), EVENT_BYTES):
                piece = chunk.data[start : start + EVENT_BYTES]
                offset += len(piece)
                text = base64.b64encode(piece).decode()
                yield f"id: {offset}\nevent: log\ndata: {text}\n\n"
            quiet_since = time.monotonic()
            continue
        if not follow or chunk.ended or time.monotonic() >= deadline:
            yield _end(chunk.offset, chunk.attempt, chunk.attempt_id, chunk.ended)
            return
        if time.monotonic() - quiet_since > 10:
            yield ": still here\n\n"  # keeps proxies from closing a quiet stream
            quiet_since = time.monotonic()
        await asyncio.sleep(0.25)


def _end(offset: int, attempt: int, attempt_id: str, ended: bool) -> str:
    data = json.dumps(
        {"offset": offset, "attempt": attempt, "attempt_id": attempt_id, "ended": ended}
    )
    return f"id: {offset}\nevent: end\ndata: {data}\n\n"
