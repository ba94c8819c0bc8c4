"""How the control plane reaches a pool's nodes, which it never calls: the node directory (the
store) it places attempts and queues commands in, the wake signal that tells the server's
long-polls a command was queued, and a gang's other ranks as handles of their own."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from orbit.model.models import RunHandle
from orbit.model.nodes import NodeRecord
from orbit.model.signals import Signal

if TYPE_CHECKING:
    from orbit.store.sql import Row

# Sent with a node id whenever a command is queued for it: the server's long-polls wake at once
# rather than on their next look at the store. One per control plane (orbit.model.signals).
NodeWakes = Signal[[str]]


class NodeReads(Protocol):
    def list_nodes(self) -> list[NodeRecord]: ...
    def get_node(self, ref: str) -> NodeRecord: ...


class NodePlacements(Protocol):
    def assign_gang(
        self, attempt_id: str, ranks: list[tuple[str, dict[str, Any], dict[str, Any]]], actor: str
    ) -> list[str] | None: ...
    def assign_attempt(
        self,
        attempt_id: str,
        node_id: str,
        gpus: dict[str, Any],
        start: dict[str, Any],
        actor: str,
    ) -> tuple[int, str] | None: ...
    def attempt_placement(self, attempt_id: str) -> Row | None: ...
    def gang_members(self, attempt_id: str) -> list[Row]: ...


class NodeQueues(Protocol):
    def enqueue_command(
        self, node_id: str, body: dict[str, Any], attempt_id: str | None = None
    ) -> str: ...


class NodeDirectory(Protocol):
    """What a pool backend uses of the store: its nodes, placements and command queues."""

    @property
    def nodes(self) -> NodeReads: ...
    @property
    def placement(self) -> NodePlacements: ...
    @property
    def commands(self) -> NodeQueues: ...


def other_ranks(handle: RunHandle, artifacts_dir: Path) -> list[RunHandle]:
    """A gang's ranks but 0 (an attempt of one node has none), as handles of their own."""
    return [
        RunHandle(
            backend_key=handle.backend_key,
            target=str(m["node"]),
            attempt_id=str(m["attempt"]),
            location=str(artifacts_dir / str(m["attempt"])),
            data={"node_id": m["node_id"], "fence": 1},
        )
        for m in handle.data.get("gang") or ()
        if m.get("rank")
    ]
