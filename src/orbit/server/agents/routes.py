"""/api/v1/agent/*: the agents' routes, each handing its message to the part of the gateway
whose job it is, in a worker thread; a long-poll waits on the node's mailbox without one."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
from fastapi import APIRouter
from fastapi.responses import FileResponse

from orbit.core.control.service import CoreControlService
from orbit.model.config import Settings
from orbit.model.errors import InvalidInput
from orbit.model.nodes import NodeRecord
from orbit.server.agents.identity import own, register_node, this_node
from orbit.server.agents.mailbox import Heartbeats, Mailbox
from orbit.server.agents.reports import Reports
from orbit.server.agents.sessions import Sessions
from orbit.server.agents.transfers import Transfers
from orbit.server.loops import LOOK_LEASE_S
from orbit.server.openapi import AGENT_TAG
from orbit.server.problems import responses
from orbit.wire import protocol as p


class Gateway:
    """What each agent message does, by job: the node's session, its reports, its files."""

    def __init__(
        self,
        service: CoreControlService,
        settings: Settings,
        on_ended: Callable[[], None] | None = None,
        reconcile_every_s: float = 1.0,
    ) -> None:
        self.store = service.store
        self.settings = settings
        self.sessions = Sessions(service.store, settings, service.wakes, service.deliver_secrets)
        # between looks an attempt is due within a period; under a look, at its lease's end
        between_looks_s = min(reconcile_every_s + 1.0, LOOK_LEASE_S / 2)
        self.reports = Reports(service.store, settings.artifacts_dir, on_ended, between_looks_s)
        self.files = Transfers(service, settings)


def make_agent_router(gateway: Gateway, mailbox: Mailbox, beats: Heartbeats) -> APIRouter:
    router = APIRouter(
        prefix=p.PREFIX, tags=[AGENT_TAG], responses=responses("refused", 401, 404, 409, 413, 422)
    )

    def threaded(fn: Callable[..., Any], *args: Any) -> Any:
        return anyio.to_thread.run_sync(fn, *args)

    @router.post("/register", response_model=p.RegisterResponse, status_code=201)
    async def register(body: p.RegisterRequest) -> p.RegisterResponse:
        """Join with a join token; the answer's credential is shown once."""
        result: p.RegisterResponse = await threaded(
            register_node, gateway.store, gateway.settings, body
        )
        beats.seen(result.node_id)
        return result

    @router.post("/sync", response_model=p.SyncResponse)
    async def sync(node: this_node, body: p.SyncRequest) -> p.SyncResponse:
        """On every (re)connect: what the node runs, answered by what it should run."""
        beats.seen(node.id)
        result: p.SyncResponse = await threaded(gateway.sessions.sync, node, body)
        return result

    def was_offline(node: NodeRecord) -> bool:
        """Silent past the offline timeout until this request: what the server gave up on
        meanwhile must be stopped there, so the node syncs again."""
        return not node.online(datetime.now(UTC), gateway.settings.node_offline_s)

    @router.post("/poll", response_model=p.PollResponse)
    async def poll(node: this_node, body: p.PollRequest) -> p.PollResponse:
        """Commands for the node: at once if any are queued, else as soon as one is, else an
        empty answer after `wait_s`. Acks of earlier commands ride along."""
        own(node, body.node_id)
        offline = was_offline(node)
        beats.seen(node.id)
        if offline:
            return p.PollResponse(resync=True)
        event = mailbox.event(node.id)
        event.clear()
        if await threaded(gateway.sessions.ack, node, body):
            return p.PollResponse(resync=True)
        deadline = time.monotonic() + body.wait_s
        while True:
            commands = await threaded(gateway.sessions.pending, node)
            left = deadline - time.monotonic()
            if commands or left <= 0:
                return p.PollResponse(commands=commands)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=left)
            event.clear()

    @router.post("/claim", response_model=p.ClaimResponse)
    async def claim(node: this_node, body: p.ClaimRequest) -> p.ClaimResponse:
        """The fencing check before a start: granted once per placement."""
        result: p.ClaimResponse = await threaded(gateway.sessions.claim, node, body)
        return result

    @router.post("/heartbeat", response_model=p.HeartbeatResponse)
    async def heartbeat(node: this_node, body: p.HeartbeatRequest) -> p.HeartbeatResponse:
        own(node, body.node_id)
        offline = was_offline(node)
        beats.seen(node.id, body.gpu_utilization)
        if body.info is not None:
            await threaded(gateway.sessions.heartbeat_info, node, body)
        return p.HeartbeatResponse(
            heartbeat_s=gateway.settings.node_heartbeat_s,
            max_tasks=node.max_tasks,
            state=node.state.value,
            resync=offline,
            fence_after_s=gateway.settings.fence_after_s,
        )

    @router.post("/report", response_model=p.ReportResponse)
    async def report(node: this_node, body: p.Report) -> p.ReportResponse:
        beats.seen(node.id)
        result: p.ReportResponse = await threaded(gateway.reports.report, node, body)
        return result

    @router.get(
        "/bundles/{digest}",
        response_class=FileResponse,
        responses={200: {"content": {"application/x-tar": {}}}},
    )
    async def bundle(node: this_node, digest: str, rebuild: bool = False) -> FileResponse:
        """The bundle's archive, for a node that runs an attempt of it; `rebuild`: the node
        found the cached one does not match its digest (a disk's fault, say), so it is made
        again from the frozen bundle."""
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise InvalidInput("digest: expected 64 hex digits")
        path: Path = await threaded(gateway.files.node_bundle, node, digest, rebuild)
        return FileResponse(path, media_type="application/x-tar")

    @router.get(
        "/transfers/{transfer_id}",
        response_class=FileResponse,
        responses={200: {"content": {"application/octet-stream": {}}}},
    )
    async def transfer(node: this_node, transfer_id: str) -> FileResponse:
        path: Path = await threaded(gateway.files.transfer_file, node, transfer_id)
        return FileResponse(path, media_type="application/octet-stream")

    @router.get(
        "/attempts/{attempt_id}/files",
        response_class=FileResponse,
        responses={200: {"content": {"application/octet-stream": {}}}},
    )
    async def attempt_file(node: this_node, attempt_id: str, path: str) -> FileResponse:
        """A file of an earlier attempt of a run this node is running (its checkpoint, for a
        resumed start), from the control plane's copy."""
        found: Path = await threaded(gateway.files.earlier_file, node, attempt_id, path)
        return FileResponse(found, media_type="application/octet-stream")

    @router.post("/transfers", response_model=dict[str, str])
    async def transfer_done(node: this_node, body: p.TransferDone) -> dict[str, str]:
        await threaded(gateway.files.transfer_done, node, body)
        return {"status": "ok"}

    return router
