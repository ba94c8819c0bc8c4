"""An agent node's session with the server: what it runs reconciled with what it should on
every (re)connect, the commands queued for it and its acks, the fencing check before a
start (granted once per placement), and the node info its heartbeats bring."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from orbit.core.execution.backends import agent_pool
from orbit.core.execution.backends.pool_nodes import NodeWakes
from orbit.core.execution.mirror import (
    write_agent_state,
)
from orbit.model.config import Settings
from orbit.model.errors import OrbitError
from orbit.model.models import RunState
from orbit.model.nodes import NodeRecord
from orbit.model.records import RunRecord
from orbit.server.agents.identity import own
from orbit.store import Store
from orbit.store.sql import read_json
from orbit.wire import protocol as p

log = logging.getLogger("orbit.server.agents")


class Sessions:
    """A node's session: resync on (re)connect, its queue of commands and their acks, the
    fencing check before a start, and the node info its heartbeats bring. Runs in worker
    threads (the store is synchronous)."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        wakes: NodeWakes,
        deliver_secrets: Callable[[RunRecord, str], dict[str, str]],
    ) -> None:
        self.store = store
        self.wakes = wakes
        self.settings = settings
        self.artifacts = settings.artifacts_dir
        self.deliver_secrets = deliver_secrets  # a run's, for one attempt (core/control/secrets)

    # --- resync ------------------------------------------------------------------------------

    def sync(self, node: NodeRecord, body: p.SyncRequest) -> p.SyncResponse:
        own(node, body.node_id)
        self.store.heartbeats.node_session(node.id, body.session)
        self.store.heartbeats.node_seen(
            node.id,
            datetime.now(UTC),
            body.info.model_dump(mode="json") if body.info is not None else None,
        )
        reported = {a.attempt_id: a for a in body.running}
        keep: list[p.Assignment] = []
        stop: list[str] = []
        halt: list[str] = []
        for attempt_id, have in reported.items():
            placed = self.store.placement.attempt_placement(attempt_id)
            mine = placed is not None and placed["node_id"] == node.id
            if not mine or placed is None or placed["fence"] != have.fence:
                stop.append(attempt_id)  # not ours to run: stopped and cleaned up
                continue
            if RunState(placed["state"]).terminal and have.alive and not have.ended:
                # given up on (lost) while the node was away: it must not go on beside its
                # retry, but its files (a checkpoint) are still welcome
                halt.append(attempt_id)
            keep.append(p.Assignment(attempt_id=attempt_id, fence=have.fence))
            # back with it: what it has not sent is on its way (a retry that resumes from it
            # waits for that, counting its quiet from now, not from before the node was away)
            write_agent_state(self.artifacts / attempt_id, synced_at=time.time())
        lost: list[str] = []
        # rebuild the queue from the store: starts not yet granted, cancels asked for
        self.store.commands.drop_commands(
            node.id, keep_kinds=("put_file", "get_file", "upload", "remove")
        )
        for row in self.store.placement.node_attempts(node.id):
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
        self.wakes(node.id)
        fresh = self.store.nodes.get_node(node.id)
        self.store.nodes.wake_waiting(fresh.max_tasks - len(fresh.running))
        return p.SyncResponse(
            keep=tuple(keep),
            stop=tuple(stop),
            lost=tuple(lost),
            halt=tuple(halt),
            heartbeat_s=self.settings.node_heartbeat_s,
            max_tasks=fresh.max_tasks,
            fence_after_s=self.settings.fence_after_s,
        )

    def _cancel_asked(self, attempt_id: str) -> bool:
        return self.store.runs.get_attempt(attempt_id).cancel_requested

    def _queue_cancel(self, node_id: str, attempt_id: str) -> None:
        placed = self.store.placement.attempt_placement(attempt_id)
        fence = int(placed["fence"] or 0) if placed is not None else 0
        body = {"kind": "cancel", "attempt_id": attempt_id, "fence": fence, "reason": "cancelled"}
        self.store.commands.enqueue_command(node_id, body, attempt_id)

    def _requeue_start(self, node: NodeRecord, attempt_id: str) -> None:
        """A start the node never claimed, queued again as the launch made it."""
        attempt = self.store.runs.get_attempt(attempt_id)
        run = self.store.runs.get_run(attempt.run_id)
        placed = self.store.placement.attempt_placement(attempt_id)
        if placed is None:
            return
        from orbit.core.execution.backends.base import AttemptContext

        request = run.request
        gpus = read_json(placed["node_gpus"]) or {}
        context = AttemptContext(run_id=run.id, attempt_id=attempt_id)
        body = agent_pool.start_body(
            context, run.bundle_digest, request, tuple(gpus.get("indices", ()))
        )
        body["fence"] = int(placed["fence"])
        if gpus.get("gang"):  # one node of a gang: its rank and where the gang meets
            body["gang"] = gpus["gang"]
        self.store.commands.enqueue_command(node.id, body, attempt_id)

    # --- commands ----------------------------------------------------------------------------

    def ack(self, node: NodeRecord, body: p.PollRequest) -> bool:
        """Acknowledge; True when an ack named a command this node was never sent (both sides
        then drop their queues and resync)."""
        own(node, body.node_id)
        unknown = self.store.commands.ack_commands(node.id, list(body.acks))
        if unknown:
            log.warning("node %s acked unknown commands %s: resync", node.name, unknown[:3])
            self.store.commands.drop_commands(
                node.id, keep_kinds=("put_file", "get_file", "upload", "remove")
            )
            return True
        return False

    def pending(self, node: NodeRecord) -> tuple[p.Command, ...]:
        return tuple(
            p.Command.model_validate({"id": r["id"], "seq": r["seq"], "body": read_json(r["body"])})
            for r in self.store.commands.pending_commands(node.id)
        )

    # --- the fencing check -------------------------------------------------------------------

    def claim(self, node: NodeRecord, body: p.ClaimRequest) -> p.ClaimResponse:
        own(node, body.node_id)
        placed = self.store.placement.attempt_placement(body.attempt_id)
        if placed is None or placed["node_id"] != node.id or placed["fence"] != body.fence:
            return p.ClaimResponse(granted=False, why="not placed on this node under that fence")
        folder = self.artifacts / body.attempt_id
        if body.refuse:
            write_agent_state(folder, refused=body.refuse)
            return p.ClaimResponse(granted=False, why="refused")
        granted, why = self.store.placement.claim_start(node.id, body.attempt_id, body.fence)
        if not granted:
            return p.ClaimResponse(granted=False, why=why)
        write_agent_state(folder, started=True, alive=True, node=node.name, fence=body.fence)
        return self._with_secrets(p.ClaimResponse(granted=True, why=why), body.attempt_id)

    def _with_secrets(self, answer: p.ClaimResponse, attempt_id: str) -> p.ClaimResponse:
        """A granted start of a run with secrets carries their values, resolved now for its
        submitter, to this node for this attempt alone (never in a command the store keeps);
        what keeps them from it fails the start (launch_failed) in one line."""
        run = self.store.runs.get_run(self.store.runs.get_attempt(attempt_id).run_id)
        if not run.request.secrets:
            return answer
        try:
            values = self.deliver_secrets(run, attempt_id)
        except OrbitError as exc:
            return answer.model_copy(update={"secrets_error": str(exc)})
        return answer.model_copy(update={"secrets": values})

    # --- liveness ------------------------------------------------------------------------------

    def heartbeat_info(self, node: NodeRecord, body: p.HeartbeatRequest) -> None:
        if body.info is not None:
            self.store.heartbeats.node_seen(
                node.id, datetime.now(UTC), body.info.model_dump(mode="json")
            )
