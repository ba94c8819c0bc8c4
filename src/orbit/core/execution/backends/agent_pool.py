"""`agent_pool_host_process` and `agent_pool_docker`: the attempt runs on an in-house node whose
agent connects out to the control plane (orbit.agent). The control plane never reaches the
node: launching places the attempt on a node and queues its start command in the store;
cancel and collect queue commands too; status, logs and files are read from the control
plane's copy of the attempt's files (orbit.core.execution.mirror), which the agent's reports
keep current. The agent runs the attempt with the local backends, so a pool run behaves on
its node as a local run does on this machine."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from orbit.agent.protocol import CANCELLED_BEFORE_START
from orbit.core.config import LOST_GRACE_S, OFFLINE_AFTER_S
from orbit.core.errors import InvalidInput, OrbitError, Refused
from orbit.core.execution.backends.base import AttemptContext, LaunchError, LogLayer, NoNodeFree
from orbit.core.execution.gang import gang_status, going_on, master_port
from orbit.core.execution.mirror import is_scratch, read_agent_state
from orbit.core.execution.runtime_state import parse_json, status_from_files
from orbit.core.models import ExecutionRequest, FailureReason, RunHandle, RunState, RunStatus
from orbit.core.nodes import NodeRecord, NodeState
from orbit.runtime import hostside

if TYPE_CHECKING:
    from orbit.core.execution.bundle import FrozenBundle
    from orbit.core.records import CollectResult
    from orbit.store.sql import Row

READ_CHUNK = 1 << 20
COLLECT_WAIT_S = 600.0

# Called with a node id whenever a command is queued for it: the server's long-polls wake at
# once rather than on their next look at the store. Process-wide, as the server is.
wake_hooks: list[Callable[[str], None]] = []


def wake(node_id: str) -> None:
    for hook in wake_hooks:
        hook(node_id)


class NodeDirectory(Protocol):
    def list_nodes(self) -> list[NodeRecord]: ...
    def get_node(self, ref: str) -> NodeRecord: ...
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
    def enqueue_command(
        self, node_id: str, body: dict[str, Any], attempt_id: str | None = None
    ) -> str: ...


def start_body(
    attempt: AttemptContext,
    digest: str,
    request: ExecutionRequest,
    gpu_indices: tuple[int, ...] | list[int],
) -> dict[str, Any]:
    """An attempt's start command (orbit.agent.protocol.StartAttempt) but for its fence, which
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
        nodes: NodeDirectory,
        artifacts_dir: Path,
        offline_after_s: float = OFFLINE_AFTER_S,
        lost_grace_s: float = LOST_GRACE_S,
    ) -> None:
        self.key = f"agent_pool_{launch_mode}"
        self.nodes = nodes
        self.artifacts_dir = artifacts_dir
        self.offline_after_s = offline_after_s
        self.lost_grace_s = lost_grace_s

    # --- launching -------------------------------------------------------------------------

    def validate(self, request: ExecutionRequest) -> None:
        from orbit.scheduler.inputs import asks_of, overflow_of, selector_of

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
            node = self.nodes.get_node(node_id)
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
            placed = self.nodes.assign_attempt(
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
        wake(node.id)
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
        """A run across several nodes: every rank placed at once or none (store.assign_gang),
        rank 0 on the attempt itself and each other on a member attempt. They meet at rank
        0's node (its --address, else its hostname) on a port made from the attempt's id."""
        ranks = list(where["gang"])
        nodes = []
        for rank in ranks:
            try:
                nodes.append(self.nodes.get_node(str(rank["node_id"])))
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
            ids = self.nodes.assign_gang(attempt.attempt_id, placed, actor="orbit")
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
            wake(node.id)
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
        relpath = hostside.newest_checkpoint(str(artifacts))
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
        state = read_agent_state(self.artifacts_dir / earlier)
        if state.get("complete") or not state.get("started") or state.get("refused"):
            return True  # all in, or it never ran: nothing more is coming
        row = self.nodes.attempt_placement(earlier)
        if row is None or row["node_id"] is None:
            return True
        try:
            node = self.nodes.get_node(row["node_id"])
        except OrbitError:
            return True
        return not node.online(datetime.now(UTC), self.offline_after_s)

    def never_placed(self, attempt: AttemptContext) -> bool:
        """No node was given the attempt (placing it is one transaction with its start)."""
        row = self.nodes.attempt_placement(attempt.attempt_id)
        return row is None or row["node_id"] is None

    def locate(self, request: ExecutionRequest, attempt: AttemptContext) -> RunHandle | None:
        row = self.nodes.attempt_placement(attempt.attempt_id)
        if row is None or row["node_id"] is None:
            return None
        try:
            name = self.nodes.get_node(row["node_id"]).name
        except OrbitError:
            name = row["node_id"]
        data: dict[str, Any] = {"node_id": row["node_id"], "fence": row["fence"]}
        members = self.nodes.gang_members(attempt.attempt_id)
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

    # --- looking ---------------------------------------------------------------------------

    def status(self, handle: RunHandle) -> RunStatus:
        """The attempt's state from its files; a gang's from every rank's: it fails as soon
        as one rank fails (saying which, on which node) and succeeds once all have."""
        first = self._status(handle)
        members = _members(handle, self.artifacts_dir)
        if not members:
            return first
        ranks = [handle, *members]
        statuses = [first] + [self._status(m) for m in members]
        # a rank whose peer's node went silent fails on its own first (its collective breaks):
        # wait until that node is back or lost, and say the node's loss rather than the task's
        # exit, which retries would otherwise not cover
        if any(s.state.terminal and s.state is not RunState.SUCCEEDED for s in statuses) and any(
            not s.state.terminal and self._silent(r) for r, s in zip(ranks, statuses, strict=True)
        ):
            return going_on(first)
        return gang_status(
            [(f"node '{r.target}'", s) for r, s in zip(ranks, statuses, strict=True)]
        )

    def _silent(self, handle: RunHandle) -> bool:
        """Whether the rank's node has stopped answering (offline, not yet given up on)."""
        try:
            node = self.nodes.get_node(str(handle.data.get("node_id", "")))
        except OrbitError:
            return False
        return not node.online(datetime.now(UTC), self.offline_after_s)

    def _status(self, handle: RunHandle) -> RunStatus:
        folder = Path(handle.location)
        runtime = folder / "runtime"
        # agent.json first: a report writes the files, then agent.json (alive: false), so a
        # wrapper said gone here has its result.json there by the time it is read below
        agent = read_agent_state(folder)
        result = parse_json(hostside.read_from(str(runtime / "result.json"), 0, -1))
        status = parse_json(hostside.read_from(str(runtime / "status.json"), 0, -1))
        if result is not None:
            return status_from_files(status, result, wrapper_alive=False)
        if agent.get("refused") == CANCELLED_BEFORE_START:
            return RunStatus(
                state=RunState.TERMINATED,
                reason=FailureReason.CANCELLED,
                message=f"cancelled before node '{handle.target}' started it",
            )
        if agent.get("refused"):
            return RunStatus(
                state=RunState.FAILED,
                reason=FailureReason.LAUNCH_FAILED,
                message=f"node '{handle.target}' did not start it: {agent['refused']}",
            )
        if agent.get("lost"):
            return _lost(handle, str(agent["lost"]))
        node_id = str(handle.data.get("node_id", ""))
        try:
            node = self.nodes.get_node(node_id)
        except OrbitError:
            return _lost(handle, f"node '{handle.target}' was removed")
        if node.state is NodeState.REVOKED:
            return _lost(handle, f"node '{node.name}' was revoked")
        ago = node.seen_ago(datetime.now(UTC))
        if ago is None or ago >= self.offline_after_s + self.lost_grace_s:
            return _lost(
                handle,
                f"node '{node.name}' silent for {ago or 0:.0f}s (offline after "
                f"{self.offline_after_s:.0f}s, lost {self.lost_grace_s:.0f}s later)",
            )
        if not agent.get("started"):
            return RunStatus(state=RunState.SUBMITTED)
        return status_from_files(status, None, wrapper_alive=bool(agent.get("alive", True)))

    def read_log(self, handle: RunHandle, layer: LogLayer, offset: int) -> tuple[bytes, int]:
        data = hostside.read_from(str(Path(handle.location) / layer.relpath), offset, READ_CHUNK)
        return data or b"", offset + len(data or b"")

    def read_file(self, handle: RunHandle, relpath: str) -> bytes | None:
        return hostside.read_from(str(Path(handle.location) / relpath), 0, -1)

    def tail_files(self, handle: RunHandle, pattern: str, max_bytes: int) -> dict[str, bytes]:
        return hostside.tail(handle.location, pattern, max_bytes)

    # --- acting ------------------------------------------------------------------------------

    def cancel(self, handle: RunHandle, reason: FailureReason) -> None:
        for member in _members(handle, self.artifacts_dir):
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
        self.nodes.enqueue_command(node_id, body, attempt_id=handle.attempt_id)
        wake(node_id)

    def stop_leftovers(self, handle: RunHandle) -> int:
        self.cancel(handle, FailureReason.CANCELLED)
        return 0

    def collect(self, handle: RunHandle, dest: Path) -> CollectResult:
        from orbit.core.execution.artifacts import copy_artifacts

        folder = Path(handle.location)
        if not read_agent_state(folder).get("complete"):
            self._ask_for_everything(handle, folder)
        got = copy_artifacts(folder / "artifacts", dest, skip=is_scratch)
        for rank, member in enumerate(_members(handle, self.artifacts_dir), start=1):
            # a gang's other ranks: each under nodes/RANK/, as each node wrote them
            where = Path(member.location)
            try:
                if not read_agent_state(where).get("complete"):
                    self._ask_for_everything(member, where)
            except (OrbitError, LaunchError) as exc:  # its node is away: what is here, said
                got = got.and_problem(f"rank {rank}: {exc}")
            if not (where / "artifacts").is_dir():
                continue
            more = copy_artifacts(where / "artifacts", dest / "nodes" / str(rank), skip=is_scratch)
            got = got.and_rank(rank, more)
        return got

    def _ask_for_everything(self, handle: RunHandle, folder: Path) -> None:
        """Large files wait on the node until collect asks: ask, and wait for them."""
        node_id = str(handle.data.get("node_id", ""))
        self.nodes.enqueue_command(
            node_id, {"kind": "upload", "attempt_id": handle.attempt_id}, handle.attempt_id
        )
        wake(node_id)
        deadline = time.monotonic() + COLLECT_WAIT_S
        while time.monotonic() < deadline:
            if read_agent_state(folder).get("complete"):
                return
            try:
                node = self.nodes.get_node(node_id)
            except OrbitError:
                raise LaunchError(
                    FailureReason.NODE_LOST, f"node '{handle.target}' was removed"
                ) from None
            if not node.online(datetime.now(UTC), self.offline_after_s):
                from orbit.core.errors import Unreachable

                raise Unreachable(
                    f"node '{node.name}' is offline: its large files stay there until it is back"
                )
            time.sleep(0.2)
        from orbit.core.errors import Unreachable

        raise Unreachable(f"node '{handle.target}' did not upload within {COLLECT_WAIT_S:.0f}s")


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


def _members(handle: RunHandle, artifacts_dir: Path) -> list[RunHandle]:
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


def _lost(handle: RunHandle, why: str) -> RunStatus:
    return RunStatus(state=RunState.FAILED, reason=FailureReason.NODE_LOST, message=why)
