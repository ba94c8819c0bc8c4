"""The server as an ASGI app: /api/v1 (the routes package, one router per resource), the web
console under /ui/ (the ui package), /healthz, /metrics and /openapi.json, with problem-details
errors, request size limits, limits on failed authentications, and the reconcile, scheduler and
gc loops running beside it."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orbit.core.control.service import CoreControlService
from orbit.model.config import Settings
from orbit.model.nodes import MAX_TRANSFER_BYTES
from orbit.model.version import __version__
from orbit.server import problems
from orbit.server.alerts.loop import AlertLoop
from orbit.server.auth import RequireToken
from orbit.server.auth_failures import AuthGuard
from orbit.server.config import ServerConfig
from orbit.server.fleet_metrics import GpuUtilization
from orbit.server.health import Health
from orbit.server.loops import Reconciler, SchedulerLoop
from orbit.server.metrics import Metrics, OpenAlerts, SchedConfigState, StorageUsage
from orbit.server.openapi import document, operation_id
from orbit.server.routes import api_routers
from orbit.server.routes.common import api_gate, me
from orbit.server.storage_loop import GcLoop
from orbit.wire.protocol import PREFIX as AGENT_PREFIX
from orbit.wire.protocol import REGISTER_PATH

UPLOAD_PATHS = frozenset({"/api/v1/runs", "/api/v1/runs/plan"})
# a collect's list of what the client has: as large as an upload may be
COLLECT_PATH = re.compile(r"/api/v1/runs/[^/]+/artifacts")
# `orbit nodes push`: one file (at most MAX_TRANSFER_BYTES) and its form around it
PUSH_PATH = re.compile(r"/api/v1/nodes/[^/]+/push")
PUSH_BYTES = MAX_TRANSFER_BYTES + 64 * 1024


def create_app(service: CoreControlService, config: ServerConfig, settings: Settings) -> FastAPI:
    from orbit.server.agents.mailbox import Heartbeats, Mailbox
    from orbit.server.agents.routes import Gateway, make_agent_router

    metrics = Metrics(service.store)
    metrics.registry.register(SchedConfigState(service.live_config))
    metrics.registry.register(OpenAlerts(service.store))
    mailbox, beats = Mailbox(service), Heartbeats(service)
    reconciler = (
        Reconciler(service, metrics, config.reconcile_every_s, config.reconcile_workers)
        if config.loops
        else None
    )
    scheduler = SchedulerLoop(service, metrics, config.reconcile_every_s) if config.loops else None
    gc_loop = GcLoop(service, config.storage.gc_every_s) if config.loops else None
    alert_loop = (
        AlertLoop(service, config.alerts, settings.node_offline_s) if config.loops else None
    )
    if scheduler is not None:
        service.pass_wanted.listen(scheduler.poke)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.store.heartbeats.server_back()
        mailbox.start()
        beats.start()
        if reconciler is not None:
            reconciler.start()
        if scheduler is not None:
            scheduler.start()
        if gc_loop is not None:
            gc_loop.start()
        if alert_loop is not None:
            alert_loop.start()
        try:
            yield
        finally:
            if alert_loop is not None:
                alert_loop.stop()
            if gc_loop is not None:
                gc_loop.stop()
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
        generate_unique_id_function=operation_id,
        responses={
            413: {"description": "too large", "content": problems.PROBLEM_CONTENT},
            429: {
                "description": "this address failed to authenticate too often: try again "
                "after Retry-After seconds",
                "content": problems.PROBLEM_CONTENT,
            },
            503: {"description": "the server's store failed", "content": problems.PROBLEM_CONTENT},
            507: {"description": "the server's disk is full", "content": problems.PROBLEM_CONTENT},
        },
        openapi_url=None,  # served below, behind a token like everything but /healthz
        docs_url=None,
        redoc_url=None,
    )
    app.state.service = service
    app.state.config = config
    app.state.roles = config.known_roles()  # built in, and the site's (server setting roles)
    app.state.reconciler = reconciler
    problems.install(app, problems.internal_paths(settings))
    for router in api_routers(service, config, metrics):
        app.include_router(router)
    metrics.registry.register(StorageUsage(service.usage))
    metrics.registry.register(GpuUtilization(service.store, beats.last_utilization))

    def ended() -> None:  # an attempt ended on its node: its run moves, its slot is free
        if reconciler is not None:
            reconciler.poke()
        if scheduler is not None:
            scheduler.poke()

    from orbit.server.ui import install_console

    install_console(app, service, beats)
    gateway = Gateway(service, settings, ended, config.reconcile_every_s)
    app.include_router(make_agent_router(gateway, mailbox, beats))

    health = Health(service, settings, config.min_free_disk_mb)

    @app.get("/healthz", tags=["server"], response_model=dict[str, str])
    async def healthz() -> Any:
        """Alive, the store answers, and its disk has room (503 with the reason if not).
        Needs no token, and no free thread of those that serve the API."""
        unhealthy = await health.problem()
        if unhealthy is not None:
            return problems.problem(503, unhealthy, "ServerError")
        return {"status": "ok", "version": __version__}

    @app.get(
        "/metrics",
        tags=["server"],
        response_class=PlainTextResponse,
        responses=problems.responses("no valid token", 401, 403),
        dependencies=[Depends(api_gate)],
    )
    def metrics_text(who: me) -> PlainTextResponse:
        """Prometheus text exposition (scrape it with a viewer's token as bearer token)."""
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(api_gate)])
    def openapi(who: me) -> JSONResponse:
        """This API's OpenAPI document."""
        return JSONResponse(document(app))

    app.add_middleware(
        BodyLimit,
        body_bytes=config.limits.body_bytes,
        upload_bytes=config.limits.upload_bytes,
        agent_bytes=config.limits.agent_bytes,
    )
    guard = AuthGuard(config.auth_failures, metrics, app.router.routes)
    app.state.auth_guard = guard  # the console's sign-in form counts its refusals too
    app.add_middleware(RequireToken, service=service, guard=guard)  # before BodyLimit reads
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
        if scope["path"] in UPLOAD_PATHS or COLLECT_PATH.fullmatch(scope["path"]):
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
