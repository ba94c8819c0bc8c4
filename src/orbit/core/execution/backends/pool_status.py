"""An agent-pool attempt's state, as the control plane sees it: from its copy of the attempt's
files (result.json, status.json, and agent.json, which the agent's reports keep), and from its
node's record: a node revoked, removed, or silent past its lost timeout loses the attempt. A
gang's state is every rank's: it fails as soon as one rank fails and succeeds once all have."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from orbit.core.execution.backends.pool_nodes import NodeDirectory, other_ranks
from orbit.core.execution.gang import gang_status, going_on
from orbit.core.execution.mirror import read_agent_state
from orbit.core.execution.runtime_state import parse_json, status_from_files
from orbit.model.errors import OrbitError
from orbit.model.models import FailureReason, RunHandle, RunState, RunStatus
from orbit.model.nodes import NodeState
from orbit.runtime import hostside
from orbit.wire.protocol import CANCELLED_BEFORE_START


class PoolStatus:
    def __init__(
        self,
        directory: NodeDirectory,
        artifacts_dir: Path,
        offline_after_s: float,
        lost_grace_s: float,
    ) -> None:
        self.directory = directory
        self.artifacts_dir = artifacts_dir
        self.offline_after_s = offline_after_s
        self.lost_grace_s = lost_grace_s

    def status(self, handle: RunHandle) -> RunStatus:
        """The attempt's state from its files; a gang's from every rank's: it fails as soon
        as one rank fails (saying which, on which node) and succeeds once all have."""
        first = self._status(handle)
        members = other_ranks(handle, self.artifacts_dir)
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
            node = self.directory.nodes.get_node(str(handle.data.get("node_id", "")))
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
            node = self.directory.nodes.get_node(node_id)
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


def _lost(handle: RunHandle, why: str) -> RunStatus:
    return RunStatus(state=RunState.FAILED, reason=FailureReason.NODE_LOST, message=why)
