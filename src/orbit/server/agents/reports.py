"""An agent's reports applied: the chunks of its attempts' files written into the control
plane's copy, what it still has to send asked for, attempts not its own (any longer)
stopped, and an attempt that ended there made due at once."""

from __future__ import annotations

import base64
import binascii
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from orbit.core.execution.mirror import (
    BadChunk,
    apply_chunk,
    read_agent_state,
    safe_path,
    write_agent_state,
)
from orbit.model.errors import InvalidInput, ServerError
from orbit.model.models import RunState
from orbit.model.nodes import NodeRecord
from orbit.server.agents.identity import own
from orbit.store import Store
from orbit.wire import protocol as p

log = logging.getLogger("orbit.server.agents")


class Reports:
    """Applies a node's reports: one at a time per node, a resend changes nothing. Runs in
    worker threads (the store is synchronous)."""

    def __init__(
        self,
        store: Store,
        artifacts: Path,
        on_ended: Callable[[], None] | None,
        between_looks_s: float,
    ) -> None:
        self.store = store
        self.artifacts = artifacts
        self.on_ended = on_ended  # the reconcile loop's poke: an attempt ended on its node
        self.between_looks_s = between_looks_s
        self._report_locks: dict[str, threading.Lock] = {}
        self._report_locks_lock = threading.Lock()

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
        if not self.store.heartbeats.report_is_new(node.id, body.session, body.seq) and not (
            self.store.heartbeats.node_session(
                node.id, body.session
            )  # a new session: numbers restart
        ):
            return p.ReportResponse(seq=body.seq)  # applied before: a resend changes nothing
        wants: list[p.Want] = []
        forget: list[str] = []
        stop: list[str] = []
        ended: list[str] = []
        for attempt, contents in zip(body.attempts, data, strict=True):
            placed = self.store.placement.attempt_placement(attempt.attempt_id)
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
        for attempt_id in body.missing:  # asked for, but the node has no folder of it
            placed = self.store.placement.attempt_placement(attempt_id)
            if placed is not None and placed["node_id"] == node.id:
                write_agent_state(
                    self.artifacts / attempt_id,
                    gone=f"node '{node.name}' no longer has the attempt's folder",
                )
        # its number is taken once all of it is applied: a report that failed half way (a
        # disk full) is applied again when it is sent again (chunks go by offset, so twice
        # is once), never taken for one applied
        self.store.heartbeats.advance_report_seq(node.id, body.session, body.seq)
        if ended:  # its run moves now, not at its next periodic look
            at = datetime.now(UTC)
            self.store.leases.make_due(ended, at, at + timedelta(seconds=self.between_looks_s))
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
