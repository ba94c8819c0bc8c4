"""The console's live parts, over Server-Sent Events: `changed` when any run's state moved (one
reader of the store for every open console, once a second, however many listen), a run's log
followed from its last lines (each event's id is the byte offset after it, so a dropped
connection resumes where it was; one reader a log however many follow it: taps.py), the
charts' data, and a whole log to download."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import threading
import time
from collections.abc import AsyncIterator
from typing import Annotated

import anyio
from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from starlette.responses import Response

from orbit.core.control.service import CoreControlService
from orbit.forensics.series import refresh_s
from orbit.model.errors import InvalidInput, OrbitError
from orbit.model.layers import LogLayer
from orbit.server.routes.common import me
from orbit.server.ui.common import FILE_HEADERS, attachment, console_router, guarded
from orbit.server.ui.taps import LogTaps, read_behind

TAIL_LINES = 500  # a log opens with its last lines; the whole is a download
FOLLOW_S = 25.0  # a stream ends after this long: the browser comes back (proxies drop idle ones)
CHANGES_EVERY_S = 1.0
KEEPALIVE_S = 15.0
SSE = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
CHARTS_FRESH_S = 5.0  # a running run's charts are read and encoded again at most this often
CHARTS_ENDED_S = 300.0  # an ended one's
CHARTS_KEPT = 64  # runs whose encoded charts are kept
WHOLE_LINE_BYTES = 64 * 1024  # a line longer than this is sent before its end comes
RESUME = re.compile(r"([0-9]{1,9}):([0-9]{1,18})")  # Last-Event-ID: ATTEMPT:OFFSET
LINE_ENDS = re.compile(r"\r\n|\r|\n")


class Changes:
    """The store's change stamp (the newest attempt's update), read once a second by one task
    while anyone listens; each listener waits for it to differ from the one it saw."""

    def __init__(self, service: CoreControlService) -> None:
        self.service = service
        self.stamp: str = ""
        self.read_at = 0.0
        self._lock = asyncio.Lock()

    async def current(self) -> str:
        async with self._lock:
            if time.monotonic() - self.read_at >= CHANGES_EVERY_S:
                self.stamp = await anyio.to_thread.run_sync(self.service.store.runs.change_stamp)
                self.read_at = time.monotonic()
            return self.stamp

    async def events(self, request: Request) -> AsyncIterator[bytes]:
        seen = await self.current()
        began, last_sent = time.monotonic(), time.monotonic()
        yield b"retry: 2000\n\n"
        while time.monotonic() - began < FOLLOW_S and not await request.is_disconnected():
            await asyncio.sleep(CHANGES_EVERY_S)
            now = await self.current()
            if now != seen:
                seen, last_sent = now, time.monotonic()
                yield b"event: changed\ndata: 1\n\n"
            elif time.monotonic() - last_sent > KEEPALIVE_S:
                last_sent = time.monotonic()
                yield b": still here\n\n"


def make_live_pages(service: CoreControlService) -> APIRouter:
    router = console_router()
    changes = Changes(service)
    taps = LogTaps(changes.current)

    @router.get("/events")
    async def events(request: Request, who: me) -> StreamingResponse:
        return StreamingResponse(
            changes.events(request), media_type="text/event-stream", headers=SSE
        )

    kept: dict[tuple[str, int, str], tuple[float, bytes]] = {}
    keeping = threading.Lock()

    @router.get("/runs/{ref}/charts.json")
    @guarded
    def charts(
        request: Request,
        who: me,
        ref: str,
        start: Annotated[float | None, Query(alias="from")] = None,
        end: Annotated[float | None, Query(alias="to")] = None,
    ) -> Response:
        """The run's charts, progress and state, encoded once a CHARTS_FRESH_S (once a run
        has ended: once a CHARTS_ENDED_S) for all who look: a hundred consoles polling a
        day-long run's charts cost one encoding of them, not a hundred. With `from` and `to`
        (epoch seconds, at most ZOOM_MAX_S apart): its GPUs between them, second by second
        (a chart zoomed in)."""
        if start is not None or end is not None:
            if start is None or end is None:
                raise InvalidInput("from, to: a zoom names both ends (epoch seconds)")
            with who.acting() as acting:
                run = acting.get_run(ref)
                window = acting.gpu_window(run.id, start, end)
            return Response(
                json.dumps(window, separators=(",", ":")).encode(),
                media_type="application/json",
                headers={"Cache-Control": "no-store"},
            )
        with who.acting() as acting:
            run = acting.get_run(ref)  # who may see it, every time
            key = (run.id, len(run.attempts), run.state.value)
            fresh = CHARTS_ENDED_S if run.state.terminal else CHARTS_FRESH_S
            at, body = kept.get(key, (0.0, b""))
            if time.monotonic() - at >= fresh:
                found = acting.charts(run.id)
                progress = acting.progress(run)
                found["state"] = run.state.value
                found["refresh_s"] = refresh_s(found["gpus"])  # when console.js asks again
                found["progress"] = progress.model_dump(mode="json") if progress else None
                body = json.dumps(found, separators=(",", ":")).encode()
                with keeping:
                    if len(kept) >= CHARTS_KEPT:
                        kept.pop(min(kept, key=lambda k: kept[k][0]))
                    kept[key] = (time.monotonic(), body)
        return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})

    @router.get("/runs/{ref}/logs/{layer}/stream")
    @guarded
    def follow(request: Request, who: me, ref: str, layer: str) -> Response:
        """The log from `Last-Event-ID` (a resume), or else its last lines, then followed."""
        chosen = layer_named(layer)
        resume = RESUME.fullmatch(request.headers.get("last-event-id", "").strip())
        with who.acting() as acting:
            run = acting.get_run(ref)
            if resume is not None and int(resume[1]) <= len(run.attempts):
                attempt, offset = int(resume[1]), int(resume[2])
            else:
                place = acting.find_log_start(run.id, chosen, lines=TAIL_LINES)
                offset, attempt = place.offset, place.attempt
        return StreamingResponse(
            _follow(taps, service, run.id, chosen, offset, attempt),
            media_type="text/event-stream",
            headers=SSE,
        )

    @router.get("/runs/{ref}/logs/{layer}/download")
    @guarded
    def download(request: Request, who: me, ref: str, layer: str) -> Response:
        chosen = layer_named(layer)
        run = service.get_run(ref)
        name = f"{run.id}-{chosen.value}.log"
        return StreamingResponse(
            _whole(service, run.id, chosen),
            media_type="text/plain; charset=utf-8",
            headers={**FILE_HEADERS, "Content-Disposition": attachment(name)},
        )

    return router


def layer_named(text: str) -> LogLayer:
    try:
        return LogLayer(text)
    except ValueError:
        names = ", ".join(layer.value for layer in LogLayer)
        raise InvalidInput(f"log layer must be one of {names}, not '{text}'") from None


async def _follow(
    taps: LogTaps,
    service: CoreControlService,
    run_id: str,
    layer: LogLayer,
    offset: int,
    attempt: int,
) -> AsyncIterator[bytes]:
    """Events of the log's text from `offset`, while the attempt runs (at most FOLLOW_S): first
    `start`, the attempt and offset they begin at (the page asks for older lines before it);
    each event's id is `ATTEMPT:OFFSET` after it, so a resume stays with its attempt. The log
    is read by its tap, once for every follower (orbit.server.ui.taps)."""
    yield b"retry: 1000\n\n" + _event("start", f"{attempt}:{offset}")
    key = (run_id, attempt, layer.value)
    make = functools.partial(service.log_follower, run_id, layer, attempt)
    try:
        tap = await taps.join(key, offset, make)
    except OrbitError as exc:
        yield _event("problem", json.dumps({"message": str(exc)}))
        return
    began, last_sent = time.monotonic(), time.monotonic()
    try:
        while True:
            moved = tap.moved  # taken before looking: a move after the look still wakes it
            ended = tap.ended
            try:
                data = tap.since(offset)
                if data is None:
                    data = await read_behind(tap, offset)
            except OrbitError as exc:
                yield _event("problem", json.dumps({"message": str(exc)}))
                return
            if data:
                # whole lines only (a line cut in two would show as two): the rest comes next
                # time; but a long line without an end (a progress bar's), or the last, goes
                cut = data.rfind(b"\n") + 1 if not ended else len(data)
                if cut == 0 and len(data) >= WHOLE_LINE_BYTES:
                    cut = len(data)
                if cut:
                    offset += cut
                    last_sent = time.monotonic()
                    text = data[:cut].decode("utf-8", "replace")
                    yield _event("log", text, f"{attempt}:{offset}")
                    continue
            if tap.problem is not None:
                yield _event("problem", json.dumps({"message": tap.problem}))
                return
            if ended:
                yield _event("end", json.dumps({"offset": offset}), f"{attempt}:{offset}")
                return
            left = FOLLOW_S - (time.monotonic() - began)
            if left <= 0:
                return
            if time.monotonic() - last_sent > KEEPALIVE_S:
                last_sent = time.monotonic()
                yield b": still here\n\n"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(moved.wait(), min(left, KEEPALIVE_S))
    finally:
        taps.leave(key, tap)


async def _whole(service: CoreControlService, run_id: str, layer: LogLayer) -> AsyncIterator[bytes]:
    offset = 0
    while True:
        read = functools.partial(service.read_log, run_id, layer, offset)
        chunk = await anyio.to_thread.run_sync(read)
        if not chunk.data:
            return
        offset = chunk.offset
        yield chunk.data


def _event(kind: str, data: str, event_id: str | None = None) -> bytes:
    """One event. EventSource ends a line at CR, LF or CRLF: each is a `data:` line of its own,
    so no text from a run can end the event or start one of its own (a CR is shown as a new
    line)."""
    lines = [f"event: {kind}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines += [f"data: {line}" for line in LINE_ENDS.split(data)]
    return ("\n".join(lines) + "\n\n").encode()
