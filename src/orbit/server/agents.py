"""The server's side of the agent protocol (orbit.agent.protocol): /api/v1/agent/*.

Agents authenticate with their node credential (its sha256 looked up per request, so that a
revoked node is refused at once) and can act only for their own node. Long-polls wait on an
event per node, set at once when this process queues a command, and within a second when
another process does (one query a second over all nodes). Heartbeats are gathered in memory and
written in one transaction a second. Every handler is a compare-and-set or an idempotent write:
a message handled twice has the effect of handling it once."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse

from orbit.agent import protocol as p
from orbit.core.auth import token_hash
from orbit.core.config import Settings
from orbit.core.control.service import CoreControlService
from orbit.core.errors import Forbidden, InvalidInput, NotFound, ServerError, Unauthorized
from orbit.core.execution.backends import agent_pool
from orbit.core.execution.mirror import (
    BadChunk,
    apply_chunk,
    read_agent_state,
    safe_path,
    write_agent_state,
)
from orbit.core.models import RunState
from orbit.core.nodes import NodeRecord, NodeState
from orbit.server.loops import LOOK_LEASE_S
from orbit.server.problems import PROBLEM, PROBLEM_SCHEMA
from orbit.store.sql import read_json

log = logging.getLogger("orbit.server.agents")

CREDENTIAL_PREFIX = "orbitnode_"
WATCH_EVERY_S = 0.5  # how often queues other processes filled are looked for
FLUSH_EVERY_S = 1.0  # how often gathered heartbeats are written


def node_of(request: Request) -> NodeRecord:
    node = request.scope.get("state", {}).get("node")
    if not isinstance(node, NodeRecord):  # the middleware sets it on every agent path
        raise Unauthorized("an agent request needs its node credential")
    return node


this_node = Annotated[NodeRecord, Depends(node_of)]


def authenticate_node(service: CoreControlService, header: str) -> NodeRecord:
    scheme, _, credential = header.partition(" ")
    if scheme.lower() != "bearer" or not credential.strip():
        raise Unauthorized("an agent request needs `Authorization: Bearer <node credential>`")
    node = service.store.node_by_credential(token_hash(credential.strip()))
    if node is None:
        raise Unauthorized("the node credential was not accepted (unknown, or its node removed)")
    if node.state is NodeState.REVOKED:
        raise Unauthorized(f"node '{node.name}' was revoked")
    return node


def own(node: NodeRecord, node_id: str) -> None:
    if node_id != node.id:
        raise Unauthorized(f"this credential is node '{node.name}''s: it cannot act for {node_id}")


class Mailbox:
    """Wakes a node's long-poll when a command is queued for it."""

    def __init__(self, service: CoreControlService) -> None:
        self.service = service
        self.loop: asyncio.AbstractEventLoop | None = None
        self.events: dict[str, asyncio.Event] = {}
        self.seen_seq = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="agent-mailbox", daemon=True)

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        with contextlib.suppress(Exception):
            self.seen_seq = self.service.store.pending_nodes(0)[1]
        agent_pool.wake_hooks.append(self.wake)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(ValueError):
            agent_pool.wake_hooks.remove(self.wake)

    def event(self, node_id: str) -> asyncio.Event:
        return self.events.setdefault(node_id, asyncio.Event())

    def wake(self, node_id: str) -> None:
        """Thread-safe."""
        if self.loop is None:
            return
        self.loop.call_soon_threadsafe(lambda: self.event(node_id).set())

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_EVERY_S):
            try:
                nodes, self.seen_seq = self.service.store.pending_nodes(self.seen_seq)
            except Exception:  # the store is away: look again next time
                continue
            for node_id in nodes:
                self.wake(node_id)


class Heartbeats:
    """Last-seen times gathered in memory and written once a second (one transaction for all
    nodes, not one per heartbeat)."""

    def __init__(self, service: CoreControlService) -> None:
        self.service = service
        self.pending: dict[str, datetime] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-heartbeats", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()

    def seen(self, node_id: str) -> None:
        with self.lock:
            self.pending[node_id] = datetime.now(UTC)

    def flush(self) -> None:
        with self.lock:
            batch, self.pending = self.pending, {}
        if batch:
            try:
                self.service.store.nodes_seen(batch)
            except Exception:
                log.warning("heartbeats not written (the store?): kept for the next flush")
                with self.lock:
                    self.pending = {**batch, **self.pending}

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_EVERY_S):
            self.flush()


class Gateway:
    """What each agent message does. Runs in worker threads (the store is synchronous)."""

    def __init__(
        self,
        service: CoreControlService,
        settings: Settings,
        on_ended: Callable[[], None] | None = None,
        reconcile_every_s: float = 1.0,
    ) -> None:
        self.service = service
        self.store = service.store
        self.settings = settings
        self.on_ended = on_ended  # the reconcile loop's poke: an attempt ended on its node
        # between looks an attempt is due within a period; under a look, at its lease's end
        self.between_looks_s = min(reconcile_every_s + 1.0, LOOK_LEASE_S / 2)
        self._report_locks: dict[str, threading.Lock] = {}
        self._report_locks_lock = threading.Lock()
        self.artifacts = settings.artifacts_dir
        self.archives = settings.home / "bundle-archives"
        self.transfers = settings.home / "transfers"

    # --- joining ---------------------------------------------------------------------------

    def register(self, body: p.RegisterRequest) -> p.RegisterResponse:
        problem = p.labels_problem(body.labels)
        if problem:
            raise InvalidInput(f"labels: {problem}")
        if body.name == "join-tokens":  # /api/v1/nodes/join-tokens is the join tokens' own
            raise InvalidInput("name: 'join-tokens' is reserved; give the node another --name")
        from orbit.core.auth import new_token

        credential = new_token(CREDENTIAL_PREFIX)
        node = self.store.register_node(
            token_hash(body.join_token),
            body.name,
            body.labels,
            body.max_tasks,
            body.info.model_dump(mode="json"),
            token_hash(credential),
        )
        return p.RegisterResponse(
            node_id=node.id,
            name=node.name,
            credential=credential,
            heartbeat_s=self.settings.node_heartbeat_s,
        )

    # --- resync ------------------------------------------------------------------------------

    def sync(self, node: NodeRecord, body: p.SyncRequest) -> p.SyncResponse:
        own(node, body.node_id)
        self.store.node_session(node.id, body.session)
        self.store.node_seen(
            node.id,
            datetime.now(UTC),
            body.info.model_dump(mode="json") if body.info is not None else None,
        )
        reported = {a.attempt_id: a for a in body.running}
        keep: list[p.Assignment] = []
        stop: list[str] = []
        for attempt_id, have in reported.items():
            placed = self.store.attempt_placement(attempt_id)
            mine = placed is not None and placed["node_id"] == node.id
            if not mine or placed is None or placed["fence"] != have.fence:
                stop.append(attempt_id)  # not ours to run: stopped and cleaned up
                continue
            if RunState(placed["state"]).terminal and have.alive and not have.ended:
                stop.append(attempt_id)  # given up on (lost) while the node was away
                continue
            keep.append(p.Assignment(attempt_id=attempt_id, fence=have.fence))
        lost: list[str] = []
        # rebuild the queue from the store: starts not yet granted, cancels asked for
        self.store.drop_commands(node.id, keep_kinds=("put_file", "get_file", "upload"))
        for row in self.store.node_attempts(node.id):
            attempt_id = row["id"]
            if attempt_id in reported:
                if self._cancel_asked(attempt_id):
                    self._queue_cancel(node.id, attempt_id)
                continue
            if row["node_claimed_at"] is not None:
                lost.append(attempt_id)
                write_agent_state(
                    self.artifacts / attempt_id,
                    lost=f"node '{node.name}' came back without it (it restarted, or lost "
                    "its work dir)",
                )
            else:
                self._requeue_start(node, attempt_id)
        agent_pool.wake(node.id)
        fresh = self.store.get_node(node.id)
        self.store.wake_waiting(fresh.max_tasks - len(fresh.running))
        return p.SyncResponse(
            keep=tuple(keep),
            stop=tuple(stop),
            lost=tuple(lost),
            heartbeat_s=self.settings.node_heartbeat_s,
            max_tasks=fresh.max_tasks,
        )

    def _cancel_asked(self, attempt_id: str) -> bool:
        return self.store.get_attempt(attempt_id).cancel_requested

    def _queue_cancel(self, node_id: str, attempt_id: str) -> None:
        placed = self.store.attempt_placement(attempt_id)
        fence = int(placed["fence"] or 0) if placed is not None else 0
        body = {"kind": "cancel", "attempt_id": attempt_id, "fence": fence, "reason": "cancelled"}
        self.store.enqueue_command(node_id, body, attempt_id)

    def _requeue_start(self, node: NodeRecord, attempt_id: str) -> None:
        """A start the node never claimed, queued again as the launch made it."""
        attempt = self.store.get_attempt(attempt_id)
        run = self.store.get_run(attempt.run_id)
        placed = self.store.attempt_placement(attempt_id)
        if placed is None:
            return
        from orbit.core.execution.backends.base import AttemptContext
        from orbit.core.models import ExecutionRequest

        request = ExecutionRequest.model_validate(run.request)
        gpus = read_json(placed["node_gpus"]) or {}
        context = AttemptContext(run_id=run.id, attempt_id=attempt_id)
        body = agent_pool.start_body(
            context, run.bundle_digest, request, tuple(gpus.get("indices", ()))
        )
        body["fence"] = int(placed["fence"])
        if gpus.get("gang"):  # one node of a gang: its rank and where the gang meets
            body["gang"] = gpus["gang"]
        self.store.enqueue_command(node.id, body, attempt_id)

    # --- commands ----------------------------------------------------------------------------

    def ack(self, node: NodeRecord, body: p.PollRequest) -> bool:
        """Acknowledge; True when an ack named a command this node was never sent (both sides
        then drop their queues and resync)."""
        own(node, body.node_id)
        unknown = self.store.ack_commands(node.id, list(body.acks))
        if unknown:
            log.warning("node %s acked unknown commands %s: resync", node.name, unknown[:3])
            self.store.drop_commands(node.id, keep_kinds=("put_file", "get_file", "upload"))
            return True
        return False

    def pending(self, node: NodeRecord) -> tuple[p.Command, ...]:
        return tuple(
            p.Command.model_validate({"id": r["id"], "seq": r["seq"], "body": read_json(r["body"])})
            for r in self.store.pending_commands(node.id)
        )

    # --- the fencing check -------------------------------------------------------------------

    def claim(self, node: NodeRecord, body: p.ClaimRequest) -> p.ClaimResponse:
        own(node, body.node_id)
        placed = self.store.attempt_placement(body.attempt_id)
        if placed is None or placed["node_id"] != node.id or placed["fence"] != body.fence:
            return p.ClaimResponse(granted=False, why="not placed on this node under that fence")
        folder = self.artifacts / body.attempt_id
        if body.refuse:
            write_agent_state(folder, refused=body.refuse)
            return p.ClaimResponse(granted=False, why="refused")
        granted, why = self.store.claim_start(node.id, body.attempt_id, body.fence)
        if granted:
            write_agent_state(folder, started=True, alive=True, node=node.name, fence=body.fence)
        return p.ClaimResponse(granted=granted, why=why)

    # --- liveness ------------------------------------------------------------------------------

    def heartbeat_info(self, node: NodeRecord, body: p.HeartbeatRequest) -> None:
        if body.info is not None:
            self.store.node_seen(node.id, datetime.now(UTC), body.info.model_dump(mode="json"))

    # --- reports -------------------------------------------------------------------------------

    def report(self, node: NodeRecord, body: p.Report) -> p.ReportResponse:
        own(node, body.node_id)
        data = self._decoded(body)  # a report refused is refused whole, before it counts
        with self._report_locks_lock:
            lock = self._report_locks.setdefault(node.id, threading.Lock())
        # one report of a node at a time: a resend that comes while the first is still being
        # applied (the agent timed out waiting) waits, then finds it applied
        with lock:
            return self._report(node, body, data)

    def _report(
        self, node: NodeRecord, body: p.Report, data: list[list[bytes]]
    ) -> p.ReportResponse:
        if not self.store.report_is_new(node.id, body.session, body.seq) and not (
            self.store.node_session(node.id, body.session)  # a new session: numbers restart
        ):
            return p.ReportResponse(seq=body.seq)  # applied before: a resend changes nothing
        wants: list[p.Want] = []
        forget: list[str] = []
        stop: list[str] = []
        ended: list[str] = []
        for attempt, contents in zip(body.attempts, data, strict=True):
            placed = self.store.attempt_placement(attempt.attempt_id)
            if placed is None or placed["node_id"] != node.id or placed["fence"] != attempt.fence:
                forget.append(attempt.attempt_id)
                if attempt.alive:
                    stop.append(attempt.attempt_id)
                continue
            if attempt.alive and not attempt.ended and RunState(placed["state"]).terminal:
                stop.append(attempt.attempt_id)  # given up on (lost): it must not go on
            folder = self.artifacts / attempt.attempt_id
            for chunk, content in zip(attempt.chunks, contents, strict=True):
                try:
                    applied = apply_chunk(
                        folder,
                        chunk.path,
                        chunk.offset,
                        content,
                        replace=chunk.replace,
                        size=chunk.size,
                        sha256=chunk.sha256,
                    )
                except BadChunk as exc:
                    raise InvalidInput(str(exc)) from None
                except OSError as exc:  # the server's disk, not the agent's doing: it resends
                    log.error("report of %s: writing %s: %s", node.name, chunk.path, exc)
                    raise ServerError(f"the server could not write {chunk.path}: {exc}") from None
                if applied.want is not None:
                    wants.append(
                        p.Want(attempt_id=attempt.attempt_id, path=chunk.path, offset=applied.want)
                    )
            state = read_agent_state(folder)
            changes: dict[str, Any] = {}
            if state.get("alive") != attempt.alive:
                changes["alive"] = attempt.alive
            if attempt.ended and not state.get("ended"):
                changes["ended"] = True
            if attempt.done and not wants and not state.get("complete"):
                changes["complete"] = True
            if changes:
                write_agent_state(folder, **changes)
                if changes.get("ended") or changes.get("complete"):
                    ended.append(attempt.attempt_id)
        # its number is taken once all of it is applied: a report that failed half way (a
        # disk full) is applied again when it is sent again (chunks go by offset, so twice
        # is once), never taken for one applied
        self.store.advance_report_seq(node.id, body.session, body.seq)
        if ended:  # its run moves now, not at its next periodic look
            at = datetime.now(UTC)
            self.store.make_due(ended, at, at + timedelta(seconds=self.between_looks_s))
            if self.on_ended is not None:
                self.on_ended()
        return p.ReportResponse(
            seq=body.seq, wants=tuple(wants), forget=tuple(forget), stop=tuple(stop)
        )

    def _decoded(self, body: p.Report) -> list[list[bytes]]:
        """The bytes of each attempt's chunks, in order. InvalidInput if any chunk's data is
        not base64 or its path leads out of the attempt's folder: before anything is written
        or the report's number taken (a resend of a report refused half way would be taken
        for one applied, and the rest of it lost)."""
        decoded: list[list[bytes]] = []
        for attempt in body.attempts:
            folder = self.artifacts / attempt.attempt_id
            chunks: list[bytes] = []
            decoded.append(chunks)
            for chunk in attempt.chunks:
                try:
                    safe_path(folder, chunk.path)
                except BadChunk as exc:
                    raise InvalidInput(str(exc)) from None
                try:
                    chunks.append(base64.b64decode(chunk.data, validate=True))
                except (binascii.Error, ValueError):
                    raise InvalidInput(f"{chunk.path}: data is not base64") from None
        return decoded

    # --- bundles and transfers -------------------------------------------------------------

    def earlier_file(self, node: NodeRecord, attempt_id: str, path: str) -> Path:
        """Refused unless the node runs (or was given) an attempt of the same run, and the
        path is a file under that attempt's artifacts."""
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", attempt_id):
            raise InvalidInput("attempt_id: expected an attempt id")
        earlier = self.store.get_attempt(attempt_id)
        mine = {self.store.get_attempt(a).run_id for a in node.running}
        if earlier.run_id not in mine:
            raise Forbidden(f"node '{node.name}' runs no attempt of run {earlier.run_id}")
        parts = path.split("/")
        if parts[0] != "artifacts" or any(p in ("", ".", "..") for p in parts) or "\x00" in path:
            raise InvalidInput("path: expected a file under artifacts/")
        found = self.artifacts / attempt_id / path
        if not found.is_file():
            raise NotFound(f"attempt {attempt_id} has no {path} here")
        return found

    def bundle_archive(self, digest: str, rebuild: bool = False) -> Path:
        from orbit.core.execution.bundle import create_bundle_archive

        source = self.service.bundles_dir / digest
        if not (source / "job.json").is_file():
            raise NotFound(f"bundle {digest[:12]} is not in this server's cache")
        archive = self.archives / f"{digest}.tar"
        if rebuild or not archive.is_file():
            self.archives.mkdir(parents=True, exist_ok=True)
            scratch = archive.with_name(f".{digest}.{threading.get_ident()}.part")
            create_bundle_archive(source, scratch)
            scratch.replace(archive)
        return archive

    def transfer_file(self, node: NodeRecord, transfer_id: str) -> Path:
        path = self.transfers / node.id / transfer_id
        if not path.is_file():
            raise NotFound(f"no transfer '{transfer_id}' for node '{node.name}'")
        return path

    def transfer_done(self, node: NodeRecord, body: p.TransferDone) -> None:
        own(node, body.node_id)
        result: dict[str, Any] = {"error": body.error}
        if body.error is None and body.sha256 is not None:
            import hashlib

            data = base64.b64decode(body.data)
            if hashlib.sha256(data).hexdigest() != body.sha256:
                raise InvalidInput("transfer: the data does not match its sha256")
            folder = self.transfers / node.id
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{body.transfer_id}.pulled").write_bytes(data)
            result["sha256"] = body.sha256
            result["size"] = len(data)
        if not self.store.finish_command(body.transfer_id, node.id, result):
            raise NotFound(f"no pending transfer '{body.transfer_id}' for node '{node.name}'")


# --- the routes -------------------------------------------------------------------------------


def _problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {
        code: {"description": "refused", "content": {PROBLEM: {"schema": PROBLEM_SCHEMA}}}
        for code in codes
    }


def make_agent_router(gateway: Gateway, mailbox: Mailbox, beats: Heartbeats) -> APIRouter:
    router = APIRouter(
        prefix=p.PREFIX, tags=["agents"], responses=_problems(401, 404, 409, 413, 422)
    )

    def threaded(fn: Callable[..., Any], *args: Any) -> Any:
        return anyio.to_thread.run_sync(fn, *args)

    @router.post("/register", response_model=p.RegisterResponse, status_code=201)
    async def register(body: p.RegisterRequest) -> p.RegisterResponse:
        """Join with a join token; the answer's credential is shown once."""
        result: p.RegisterResponse = await threaded(gateway.register, body)
        beats.seen(result.node_id)
        return result

    @router.post("/sync", response_model=p.SyncResponse)
    async def sync(node: this_node, body: p.SyncRequest) -> p.SyncResponse:
        """On every (re)connect: what the node runs, answered by what it should run."""
        beats.seen(node.id)
        result: p.SyncResponse = await threaded(gateway.sync, node, body)
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
        if await threaded(gateway.ack, node, body):
            return p.PollResponse(resync=True)
        deadline = time.monotonic() + body.wait_s
        while True:
            commands = await threaded(gateway.pending, node)
            left = deadline - time.monotonic()
            if commands or left <= 0:
                return p.PollResponse(commands=commands)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=left)
            event.clear()

    @router.post("/claim", response_model=p.ClaimResponse)
    async def claim(node: this_node, body: p.ClaimRequest) -> p.ClaimResponse:
        """The fencing check before a start: granted once per placement."""
        result: p.ClaimResponse = await threaded(gateway.claim, node, body)
        return result

    @router.post("/heartbeat", response_model=p.HeartbeatResponse)
    async def heartbeat(node: this_node, body: p.HeartbeatRequest) -> p.HeartbeatResponse:
        own(node, body.node_id)
        offline = was_offline(node)
        beats.seen(node.id)
        if body.info is not None:
            await threaded(gateway.heartbeat_info, node, body)
        return p.HeartbeatResponse(
            heartbeat_s=gateway.settings.node_heartbeat_s,
            max_tasks=node.max_tasks,
            state=node.state.value,
            resync=offline,
        )

    @router.post("/report", response_model=p.ReportResponse)
    async def report(node: this_node, body: p.Report) -> p.ReportResponse:
        beats.seen(node.id)
        result: p.ReportResponse = await threaded(gateway.report, node, body)
        return result

    @router.get(
        "/bundles/{digest}",
        response_class=FileResponse,
        responses={200: {"content": {"application/x-tar": {}}}},
    )
    async def bundle(node: this_node, digest: str, rebuild: bool = False) -> FileResponse:
        """The bundle's archive; `rebuild`: the node found the cached one does not match its
        digest (a disk's fault, say), so it is made again from the frozen bundle."""
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise InvalidInput("digest: expected 64 hex digits")
        path: Path = await threaded(gateway.bundle_archive, digest, rebuild)
        return FileResponse(path, media_type="application/x-tar")

    @router.get(
        "/transfers/{transfer_id}",
        response_class=FileResponse,
        responses={200: {"content": {"application/octet-stream": {}}}},
    )
    async def transfer(node: this_node, transfer_id: str) -> FileResponse:
        path: Path = await threaded(gateway.transfer_file, node, transfer_id)
        return FileResponse(path, media_type="application/octet-stream")

    @router.get(
        "/attempts/{attempt_id}/files",
        response_class=FileResponse,
        responses={200: {"content": {"application/octet-stream": {}}}},
    )
    async def attempt_file(node: this_node, attempt_id: str, path: str) -> FileResponse:
        """A file of an earlier attempt of a run this node is running (its checkpoint, for a
        resumed start), from the control plane's copy."""
        found: Path = await threaded(gateway.earlier_file, node, attempt_id, path)
        return FileResponse(found, media_type="application/octet-stream")

    @router.post("/transfers", response_model=dict[str, str])
    async def transfer_done(node: this_node, body: p.TransferDone) -> dict[str, str]:
        await threaded(gateway.transfer_done, node, body)
        return {"status": "ok"}

    return router


def other_version(version: str | None) -> str | None:
    """Why an agent speaking `version` (its X-Orbit-Agent-Protocol header) is refused."""
    if version != str(p.PROTOCOL_VERSION):
        return (
            f"this server speaks agent protocol {p.PROTOCOL_VERSION}, the agent "
            f"{version or 'none'}: run the same ORBIT version on both"
        )
    return None
