"""The server as an ASGI app: /api/v1 (routes.py), /healthz, /metrics and /openapi.json, with
problem-details errors, request size limits, and the reconcile loop running beside it."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orbit import __version__
from orbit.agent.protocol import PREFIX as AGENT_PREFIX
from orbit.agent.protocol import REGISTER_PATH
from orbit.core.config import Settings
from orbit.core.control.service import CoreControlService
from orbit.core.nodes import MAX_TRANSFER_BYTES
from orbit.server import problems
from orbit.server.auth import RequireToken
from orbit.server.config import ServerConfig
from orbit.server.loops import Reconciler, SchedulerLoop
from orbit.server.metrics import Metrics
from orbit.server.routes import make_router, me

UPLOAD_PATHS = frozenset({"/api/v1/runs", "/api/v1/runs/plan"})
# `orbit nodes push`: one file (at most MAX_TRANSFER_BYTES) and its form around it
PUSH_PATH = re.compile(r"/api/v1/nodes/[^/]+/push")
PUSH_BYTES = MAX_TRANSFER_BYTES + 64 * 1024
PROBLEM_CONTENT = {problems.PROBLEM: {"schema": problems.PROBLEM_SCHEMA}}


def create_app(service: CoreControlService, config: ServerConfig, settings: Settings) -> FastAPI:
    from orbit.server.agents import Gateway, Heartbeats, Mailbox, make_agent_router

    metrics = Metrics(service.store)
    mailbox, beats = Mailbox(service), Heartbeats(service)
    reconciler = (
        Reconciler(service, metrics, config.reconcile_every_s, config.reconcile_workers)
        if config.loops
        else None
    )
    scheduler = SchedulerLoop(service, metrics, config.reconcile_every_s) if config.loops else None
    if scheduler is not None:
        service.schedule_hook = scheduler.poke

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.store.server_back()
        mailbox.start()
        beats.start()
        if reconciler is not None:
            reconciler.start()
        if scheduler is not None:
            scheduler.start()
        try:
            yield
        finally:
            if scheduler is not None:
                scheduler.stop()
            if reconciler is not None:
                reconciler.stop()
            mailbox.stop()
            beats.stop()

    app = FastAPI(
        title="ORBIT",
        version=__version__,
        summary="A control plane for ML jobs on GPUs that come and go.",
        lifespan=lifespan,
        responses={
            413: {"description": "too large", "content": PROBLEM_CONTENT},
            503: {"description": "the server's store failed", "content": PROBLEM_CONTENT},
        },
        openapi_url=None,  # served below, behind a token like everything but /healthz
        docs_url=None,
        redoc_url=None,
    )
    app.state.service = service
    app.state.reconciler = reconciler
    problems.install(app)
    app.include_router(make_router(service, config, metrics))

    def ended() -> None:  # an attempt ended on its node: its run moves, its slot is free
        if reconciler is not None:
            reconciler.poke()
        if scheduler is not None:
            scheduler.poke()

    gateway = Gateway(service, settings, ended, config.reconcile_every_s)
    app.include_router(make_agent_router(gateway, mailbox, beats))

    @app.get("/healthz", tags=["server"], response_model=dict[str, str])
    def healthz() -> dict[str, str]:
        """Alive, and the store answers. Needs no token."""
        service.store.count_runs(states=set())
        return {"status": "ok", "version": __version__}

    @app.get("/metrics", tags=["server"], response_class=PlainTextResponse)
    def metrics_text(who: me) -> PlainTextResponse:
        """Prometheus text exposition (scrape it with a viewer's token as bearer token)."""
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/openapi.json", include_in_schema=False)
    def openapi(who: me) -> JSONResponse:
        """This API's OpenAPI document."""
        return JSONResponse(app.openapi())

    app.add_middleware(
        BodyLimit,
        body_bytes=config.limits.body_bytes,
        upload_bytes=config.limits.upload_bytes,
        agent_bytes=config.limits.agent_bytes,
    )
    app.add_middleware(RequireToken, service=service)  # runs before BodyLimit reads a byte
    app.add_middleware(Timed, metrics=metrics)
    return app


class Timed:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = metrics.asgi(app)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


class TooLarge(HTTPException):
    """Raised while the app reads a body sent without Content-Length that goes over the limit
    (an HTTPException, so that FastAPI's body parsing passes it on as it is)."""

    def __init__(self, limit: int, what: str) -> None:
        super().__init__(
            413, f"the request is larger than this server takes: {limit:,} bytes ({what})"
        )


class BodyLimit:
    """Refuse a request body over the limit with 413 before anything reads it (by its
    Content-Length), or as soon as a body sent without one goes over."""

    def __init__(self, app: ASGIApp, body_bytes: int, upload_bytes: int, agent_bytes: int) -> None:
        self.app, self.body_bytes, self.upload_bytes = app, body_bytes, upload_bytes
        self.agent_bytes = agent_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] in UPLOAD_PATHS:
            limit, what = self.upload_bytes, "limits.upload_bytes"
        elif PUSH_PATH.fullmatch(scope["path"]):
            limit, what = PUSH_BYTES, "a pushed file: 48 MiB, and its form"
        elif scope["path"].startswith(AGENT_PREFIX) and scope["path"] != REGISTER_PATH:
            # an agent's reports and transfers; registering needs no credential, so it gets
            # no more room than any other request a stranger may send
            limit, what = self.agent_bytes, "limits.agent_bytes"
        else:
            limit, what = self.body_bytes, "limits.body_bytes"
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await _too_large(send, limit, what)
            return
        seen = 0
        started = False

        async def counting() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise TooLarge(limit, what)
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting, sending)
        except TooLarge:
            if not started:
                await _too_large(send, limit, what)


async def _too_large(send: Send, limit: int, what: str) -> None:
    body = json.dumps(
        {
            "type": "about:blank",
            "title": "Too large",
            "status": 413,
            "detail": f"the request is larger than this server takes: {limit:,} bytes ({what})",
            "error": "InvalidInput",
        }
    ).encode()
    headers = [
        (b"content-type", problems.PROBLEM.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
