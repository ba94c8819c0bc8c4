"""Nodes as people manage them: join tokens, drain, cordon, revoke, remove, and files to and from
a node's work dir. Who may do it is the server's to check (admins); these only do it, audited.
The agents' own traffic is the server's (orbit.server.agents)."""

from __future__ import annotations

import hashlib
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from orbit.core.control.base import ServicePart
from orbit.model.auth import new_token
from orbit.model.auth import token_hash as hash_of
from orbit.model.durations import parse_duration
from orbit.model.errors import InvalidInput, Refused, Unreachable
from orbit.model.nodes import MAX_REASON, JoinTokenRecord, NewJoinToken, NodeRecord, NodeState
from orbit.model.nodes import MAX_TRANSFER_BYTES as MAX_TRANSFER_BYTES

JOIN_PREFIX = "orbitjoin_"
TRANSFER_WAIT_S = 120.0


def _reason(text: str) -> str:
    """A drain's or cordon's reason: a few words on one line."""
    said = " ".join(text.split())
    if not said or len(said) > MAX_REASON:
        raise InvalidInput(f"--reason: give a few words (1 to {MAX_REASON} characters)")
    return said


class Nodes(ServicePart):
    def create_join_token(
        self, labels: dict[str, str] | None = None, expires: str | None = None
    ) -> NewJoinToken:
        """A token agents join with, shown this once (the store keeps its hash). Nodes that
        join with it get its labels (their own --labels on top)."""
        from orbit.wire.protocol import labels_problem

        labels = labels or {}
        problem = labels_problem(labels)
        if problem:
            raise InvalidInput(f"--labels: {problem}")
        expires_at = datetime.now(UTC) + parse_duration(expires, "--expires") if expires else None
        token = new_token(JOIN_PREFIX)
        record = self.store.nodes.create_join_token(hash_of(token), labels, expires_at, self.actor)
        return NewJoinToken(record=record, token=token)

    def list_join_tokens(self) -> list[JoinTokenRecord]:
        return self.store.nodes.list_join_tokens()

    def revoke_join_token(self, token_id: str) -> None:
        self.store.nodes.revoke_join_token(token_id, self.actor)

    def _judged(self, node: NodeRecord) -> NodeRecord:
        """The record with this control plane's offline timeout, which its readers judge by."""
        return node.model_copy(update={"offline_after_s": self.config.node_offline_s})

    def list_nodes(self) -> list[NodeRecord]:
        return [self._judged(n) for n in self.store.nodes.list_nodes()]

    def get_node(self, ref: str) -> NodeRecord:
        return self._judged(self.store.nodes.get_node(ref))

    def set_node(
        self,
        ref: str,
        *,
        cordon: bool | None = None,
        max_tasks: int | None = None,
        reason: str | None = None,
    ) -> NodeRecord:
        """Cordon (no new work) or uncordon; set max_tasks (0: drain: no new work, and once
        its running work ends the node is free for people). `reason` says why it is out of
        service (shown with it, audited); it is cleared once the node takes work again."""
        if max_tasks is not None and not 0 <= max_tasks <= 1024:
            raise InvalidInput(f"--max-tasks: expected 0 to 1024, got {max_tasks}")
        state = None if cordon is None else NodeState.CORDONED if cordon else NodeState.ACTIVE
        node = self.store.nodes.get_node(ref)
        takes_work = (state or node.state) is NodeState.ACTIVE and (
            node.max_tasks if max_tasks is None else max_tasks
        ) > 0
        if reason is not None:
            reason = _reason(reason)
            if takes_work:
                raise InvalidInput(
                    f"--reason: node '{node.name}' takes work: a reason is for a node out of "
                    "service (drain or cordon it)"
                )
        return self._judged(
            self.store.nodes.update_node(
                node.id,
                self.actor,
                state=state,
                max_tasks=max_tasks,
                reason=reason,
                clear_reason=takes_work,
            )
        )

    def revoke_node(self, ref: str) -> NodeRecord:
        """Lock a node out at once: its credential is refused from the next request on, and
        its attempts are lost (and retried elsewhere, per their retry policy)."""
        return self._judged(self.store.nodes.update_node(ref, self.actor, state=NodeState.REVOKED))

    def remove_node(self, ref: str, force: bool = False) -> NodeRecord:
        """Forget a node. Refused while it runs attempts, unless `force` (they are lost)."""
        return self._judged(self.store.nodes.remove_node(ref, self.actor, force))

    # --- files to and from a node's work dir ---------------------------------------------

    def push_file(self, ref: str, data: bytes, dest: str) -> dict[str, object]:
        """Write `data` to `dest` (relative to the node's work dir) on the node."""
        node = self.store.nodes.get_node(ref)
        if len(data) > MAX_TRANSFER_BYTES:
            raise InvalidInput(f"push: at most {MAX_TRANSFER_BYTES:,} bytes per file")
        transfer_id = f"cmd-{uuid.uuid4().hex}"
        folder = self._transfers(node.id)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / transfer_id).write_bytes(data)
        body = {
            "kind": "put_file",
            "transfer_id": transfer_id,
            "dest": dest,
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
        }
        try:
            result = self._run_transfer(node, transfer_id, body, f"push to {dest}")
        finally:
            (folder / transfer_id).unlink(missing_ok=True)
        self.store.audit.record_event(
            self.actor, "node.push", node=node.name, dest=dest, size=len(data)
        )
        return result

    def pull_file(self, ref: str, path: str) -> bytes:
        """A file under the node's work dir."""
        node = self.store.nodes.get_node(ref)
        transfer_id = f"cmd-{uuid.uuid4().hex}"
        body: dict[str, object] = {"kind": "get_file", "transfer_id": transfer_id, "path": path}
        self._run_transfer(node, transfer_id, body, f"pull of {path}")
        pulled = self._transfers(node.id) / f"{transfer_id}.pulled"
        try:
            data = pulled.read_bytes()
        finally:
            pulled.unlink(missing_ok=True)
        self.store.audit.record_event(
            self.actor, "node.pull", node=node.name, path=path, size=len(data)
        )
        return data

    def _transfers(self, node_id: str) -> Path:
        """Where the server keeps files on their way to and from a node ($ORBIT_HOME)."""
        return self.bundles_dir.parent / "transfers" / node_id

    def _run_transfer(
        self, node: NodeRecord, transfer_id: str, body: dict[str, object], what: str
    ) -> dict[str, object]:
        if node.state is NodeState.REVOKED:
            raise InvalidInput(f"node '{node.name}' is revoked")
        if not node.online(datetime.now(UTC)):
            raise Unreachable(f"node '{node.name}' is offline")
        self.store.commands.enqueue_command(node.id, body, command_id=transfer_id)
        self.shared.wakes(node.id)
        deadline = time.monotonic() + TRANSFER_WAIT_S
        while time.monotonic() < deadline:
            result = self.store.commands.command_result(transfer_id)
            if result is not None:
                if result.get("error"):
                    raise Refused(f"node '{node.name}': {what}: {result['error']}")
                return result
            time.sleep(0.05)
        raise Unreachable(f"node '{node.name}' did not finish the {what} in {TRANSFER_WAIT_S:.0f}s")
