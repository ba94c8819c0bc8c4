"""`agent_pool_host_process` and `agent_pool_docker`: the attempt runs on an in-house node whose
agent connects out to the control plane (orbit.agent). The control plane never reaches the
node: launching places the attempt on a node and queues its start command in the store;
cancel and collect queue commands too; status, logs and files are read from the control
plane's copy of the attempt's files (orbit.core.execution.mirror), which the agent's reports
keep current (reading and collecting them: pool_files.py; an attempt's state from them:
pool_status.py; the node directory and the wake signal: pool_nodes.py). The agent runs the
attempt with the local backends, so a pool run behaves on its node as a local run does on
this machine."""

from __future__ import annotations

import contextlib
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orbit.core.execution.backends.base import (
    AttemptContext,
    CopyArtifacts,
    LogLayer,
    NoNodeFree,
)
from orbit.core.execution.backends.pool_files import PoolFiles
from orbit.core.execution.backends.pool_nodes import NodeDirectory, NodeWakes, other_ranks
from orbit.core.execution.backends.pool_status import PoolStatus
from orbit.core.execution.gang import master_port
from orbit.core.execution.mirror import is_scratch, read_agent_state
from orbit.model.config import LOST_GRACE_S, OFFLINE_AFTER_S
from orbit.model.errors import InvalidInput, OrbitError, Refused
from orbit.model.models import ExecutionRequest, FailureReason, RunHandle, RunStatus
from orbit.model.nodes import NodeRecord
from orbit.runtime.checkpoint_finder import newest_checkpoint

if TYPE_CHECKING:
    from orbit.core.execution.bundle import FrozenBundle
    from orbit.model.records import CollectResult

# a resumed start waits for the earlier attempt's files (its newest checkpoint) while they come;
# once nothing of them arrived for this long, it starts from what the control plane has
EARLIER_QUIET_S = 60.0


def start_body(
    attempt: AttemptContext,
    digest: str,
    request: ExecutionRequest,
    gpu_indices: tuple[int, ...] | list[int],
) -> dict[str, Any]:
    """An attempt's start command (orbit.wire.protocol.StartAttempt) but for its fence, which
    the store adds as it places the attempt."""
    return {
        "kind": "start",
        "run_id": attempt.run_id,
        "attempt_id": attempt.attempt_id,
        "bundle_digest": digest,
        "request": request.model_dump(mode="json"),
        "gpu_indices": list(gpu_indices),
        "upload_large": bool(getattr(request.placement, "upload_large", True)),
    }


class AgentPoolBackend:
    def __init__(
        self,
        launch_mode: str,
        directory: NodeDirectory,
        artifacts_dir: Path,
        offline_after_s: float = OFFLINE_AFTER_S,
        lost_grace_s: float = LOST_GRACE_S,
        wakes: NodeWakes | None = None,
    ) -> None:
        self.key = f"agent_pool_{launch_mode}"
        self.directory = directory
        self.wakes = wakes if wakes is not None else NodeWakes()
        self.artifacts_dir = artifacts_dir
        self.offline_after_s = offline_after_s
        self.lost_grace_s = lost_grace_s
        self.files = PoolFiles(directory, artifacts_dir, offline_after_s, self.wakes)
        self.looks = PoolStatus(directory, artifacts_dir, offline_after_s, lost_grace_s)

    # --- launching -------------------------------------------------------------------------

    def validate(self, request: ExecutionRequest) -> None:
        from orbit.scheduler.request_views import asks_of, overflow_of, selector_of

        selector_of(request)
        overflow_of(request)
        asks_of(request.resources)
        upload = getattr(request.placement, "upload_large", True)
        if not isinstance(upload, bool):
            raise InvalidInput(
                f"template '{request.template_id}': placement.upload_large: expected true or false"
            )

    def launch(
        self, bundle: FrozenBundle, request: ExecutionRequest, attempt: AttemptContext
    ) -> RunHandle:
        """Commit the scheduler's placement (orbit.core.control.scheduling): the node's slot,
        its GPUs and the start command in one store transaction, which refuses a placement
        made on stale state (NoNodeFree: the next pass places it again)."""
        where = attempt.placement
        if where is None:
            raise NoNodeFree("waiting for the scheduler")
        if len(where.get("gang") or ()) > 1:
            return self._launch_gang(bundle, request, attempt, where)
        node_id = str(where["node_id"])
        try:
            node = self.directory.nodes.get_node(node_id)
        except OrbitError:
            raise NoNodeFree(
                f"node '{where.get('node')}' was removed before the placement"
            ) from None
        indices = [int(i) for i in where.get("gpus", ())]
        gpus = _given(node, indices, where)
        start = start_body(attempt, bundle.digest, request, indices)
        if where.get("resume_from"):
            start["resume"] = self.resume_from(str(where["resume_from"]))
        try:
            placed = self.directory.placement.assign_attempt(
                attempt.attempt_id,
                node.id,
                gpus,
                start,
                actor="orbit",
            )
        except Refused:  # another launcher placed it meanwhile: that placement it is
            existing = self.locate(request, attempt)
            if existing is None:
                raise
            return existing
        if placed is None:
            raise NoNodeFree(
                f"node '{node.name}' filled up or stopped taking work before the plan was committed"
            )
        fence, _command = placed
        self.wakes(node.id)
        return RunHandle(
            backend_key=self.key,
            target=node.name,
            attempt_id=attempt.attempt_id,
            location=str(self.artifacts_dir / attempt.attempt_id),
            data={"node_id": node.id, "fence": fence, "gpus": indices},
        )

    def _launch_gang(
        self,
        bundle: FrozenBundle,
        request: ExecutionRequest,
        attempt: AttemptContext,
        where: dict[str, Any],
    ) -> RunHandle:
        """A run across several nodes: every rank placed at once or none
        (store.placement.assign_gang), rank 0 on the attempt itself and each other on a member
        attempt. They meet at rank 0's node (its --address, else its hostname) on a port made
        from the attempt's id."""
        ranks = list(where["gang"])
        nodes = []
        for rank in ranks:
            try:
                nodes.append(self.directory.nodes.get_node(str(rank["node_id"])))
            except OrbitError:
                raise NoNodeFree(
                    f"node '{rank.get('node')}' was removed before the placement"
                ) from None
        info = nodes[0].info
        gang = {
            "num_nodes": len(ranks),
            "master_addr": str(info.get("address") or info.get("hostname") or nodes[0].name),
            "master_port": master_port(attempt.attempt_id),
        }
        placed: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
        for n, (rank, node) in enumerate(zip(ranks, nodes, strict=True)):
            indices = [int(i) for i in rank.get("gpus", ())]
            gpus = {**_given(node, indices, where), "gang": {**gang, "rank": n}}
            start = start_body(attempt, bundle.digest, request, indices)
            start["gang"] = gpus["gang"]
            if n == 0 and where.get("resume_from"):
                start["resume"] = self.resume_from(str(where["resume_from"]))
            placed.append((node.id, gpus, start))
        try:
            ids = self.directory.placement.assign_gang(attempt.attempt_id, placed, actor="orbit")
        except Refused:
            existing = self.locate(request, attempt)
            if existing is None:
                raise
            return existing
        if ids is None:
            raise NoNodeFree(
                "a node of the gang ("
                + ", ".join(n.name for n in nodes)
                + ") filled up or stopped taking work before the plan was committed"
            )
        for node in nodes:
            self.wakes(node.id)
        return RunHandle(
            backend_key=self.key,
            target=nodes[0].name,
            attempt_id=attempt.attempt_id,
            location=str(self.artifacts_dir / attempt.attempt_id),
            data={
                "node_id": nodes[0].id,
                "fence": 1,
                "gpus": placed[0][1]["indices"],
                "gang": [
                    {"rank": n, "attempt": ids[n], "node_id": node.id, "node": node.name}
                    for n, node in enumerate(nodes)
                ],
            },
        )

    def resume_from(self, earlier: str) -> dict[str, Any] | None:
        """The newest checkpoint an earlier attempt of the run left (README: "Preemption and
        resume"), as the control plane's copy has it: where it goes, and its files."""
        artifacts = self.artifacts_dir / earlier / "artifacts"
        relpath = newest_checkpoint(str(artifacts))
        if relpath is None:
            return None
        top = artifacts / relpath
        paths = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        files = [
            (str(p.relative_to(artifacts.parent)).replace(os.sep, "/"), p.stat().st_size)
            for p in paths
            if not is_scratch(p.relative_to(artifacts))
        ]
        return {"attempt_id": earlier, "relpath": relpath, "files": files}

    def earlier_files_in(self, earlier: str) -> bool:
        """Whether an earlier attempt's files have all reached the control plane's copy, or
        never will (it never started, or its node is gone): a resumed start waits for them,
        so that its checkpoint is the newest one."""
        folder = self.artifacts_dir / earlier
        state = read_agent_state(folder)
        if state.get("complete") or not state.get("started") or state.get("refused"):
            return True  # all in, or it never ran: nothing more is coming
        if state.get("gone") or _quiet_for(folder) >= EARLIER_QUIET_S:
            return True  # its node has no folder of it, or has sent nothing for long
        row = self.directory.placement.attempt_placement(earlier)
        if row is None or row["node_id"] is None:
            return True
        try:
            node = self.directory.nodes.get_node(row["node_id"])
        except OrbitError:
            return True
        return not node.online(datetime.now(UTC), self.offline_after_s)

    def never_placed(self, attempt: AttemptContext) -> bool:
        """No node was given the attempt (placing it is one transaction with its start)."""
        row = self.directory.placement.attempt_placement(attempt.attempt_id)
        return row is None or row["node_id"] is None

    def locate(self, request: ExecutionRequest, attempt: AttemptContext) -> RunHandle | None:
        row = self.directory.placement.attempt_placement(attempt.attempt_id)
        if row is None or row["node_id"] is None:
            return None
        try:
            name = self.directory.nodes.get_node(row["node_id"]).name
        except OrbitError:
            name = row["node_id"]
        data: dict[str, Any] = {"node_id": row["node_id"], "fence": row["fence"]}
        members = self.directory.placement.gang_members(attempt.attempt_id)
        if members:  # a gang: its other ranks, as its launch recorded them
            data["gang"] = [
                {"rank": 0, "attempt": attempt.attempt_id, "node_id": row["node_id"], "node": name}
            ] + [
                {"rank": m["rank"], "attempt": m["id"], "node_id": m["node_id"], "node": m["name"]}
                for m in members
            ]
        return RunHandle(
            backend_key=self.key,
            target=name,
            attempt_id=attempt.attempt_id,
            location=str(self.artifacts_dir / attempt.attempt_id),
            data=data,
        )

    # --- looking (pool_status.py) ----------------------------------------------------------

    def status(self, handle: RunHandle) -> RunStatus:
        return self.looks.status(handle)

    # --- the attempt's files: the control plane's copy (pool_files.py) -----------------------

    def read_log(self, handle: RunHandle, layer: LogLayer, offset: int) -> tuple[bytes, int]:
        return self.files.read_log(handle, layer, offset)

    def read_log_end(self, handle: RunHandle, layer: LogLayer, max_bytes: int) -> tuple[bytes, int]:
        return self.files.read_log_end(handle, layer, max_bytes)

    def read_file(self, handle: RunHandle, relpath: str) -> bytes | None:
        return self.files.read_file(handle, relpath)

    def read_range(
        self, handle: RunHandle, relpath: str, offset: int, limit: int
    ) -> tuple[bytes, int]:
        return self.files.read_range(handle, relpath, offset, limit)

    def tail_files(self, handle: RunHandle, pattern: str, max_bytes: int) -> dict[str, bytes]:
        return self.files.tail_files(handle, pattern, max_bytes)

    def collect_in_place(self, handle: RunHandle, copy: CopyArtifacts) -> CollectResult:
        return self.files.collect_in_place(handle, copy)

    def collect(
        self, handle: RunHandle, dest: Path, copy: CopyArtifacts | None = None
    ) -> CollectResult:
        return self.files.collect(handle, dest, copy)

    # --- acting ------------------------------------------------------------------------------

    def cancel(self, handle: RunHandle, reason: FailureReason) -> None:
        for member in other_ranks(handle, self.artifacts_dir):
            self._cancel(member, reason)
        self._cancel(handle, reason)

    def _cancel(self, handle: RunHandle, reason: FailureReason) -> None:
        node_id = str(handle.data.get("node_id", ""))
        body = {
            "kind": "cancel",
            "attempt_id": handle.attempt_id,
            "fence": int(handle.data.get("fence") or 0),
            "reason": reason.value,
        }
        self.directory.commands.enqueue_command(node_id, body, attempt_id=handle.attempt_id)
        self.wakes(node_id)

    def stop_leftovers(self, handle: RunHandle) -> int:
        self.cancel(handle, FailureReason.CANCELLED)
        return 0


def _quiet_for(folder: Path) -> float:
    """Seconds since anything under `folder` last changed (inf when it has nothing)."""
    newest = 0.0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
    return time.time() - newest if newest else float("inf")


def _given(node: NodeRecord, indices: list[int], where: dict[str, Any]) -> dict[str, Any]:
    """What a placement gives an attempt on `node` (attempts.node_gpus)."""
    return {
        "indices": indices,
        "memory_gb": float(where.get("gpu_share_gb") or 0.0),
        "gpu_gb": {
            str(a.get("index")): float(a.get("memory_mb", 0)) / 1024
            for a in node.info.get("accelerators", ())
        },
        "cpus": float(where.get("cpus") or 0.0),
        "memory_gb_ram": float(where.get("memory_gb") or 0.0),
    }
