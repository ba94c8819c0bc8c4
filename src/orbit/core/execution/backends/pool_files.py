"""Reading an agent pool attempt's logs and files from the control plane's copy
(orbit.core.execution.mirror), and collecting them: ask each node for what it still holds,
then wait while it keeps coming, saying in one line why the rest will not come."""

from __future__ import annotations

import contextlib
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from orbit.core.execution.backends.base import CopyArtifacts
from orbit.core.execution.backends.local_files import LocalFiles
from orbit.core.execution.backends.pool_nodes import NodeDirectory, NodeWakes, other_ranks
from orbit.core.execution.mirror import is_scratch, read_agent_state
from orbit.model.errors import OrbitError
from orbit.model.models import RunHandle
from orbit.runtime import hostside

if TYPE_CHECKING:
    from orbit.model.records import CollectResult

# orbit collect waits for what the node still has to send while it keeps coming: it gives up
# once nothing new arrived for COLLECT_IDLE_S (or COLLECT_MAX_S in all), and at once when the
# node says it has no folder of the attempt, has gone offline or was removed; an attempt still
# running gives what it has sent so far (README: "Collect never hangs")
COLLECT_IDLE_S = 30.0
COLLECT_MAX_S = 600.0  # and at most this long in all


class PoolFiles(LocalFiles):
    """An agent pool attempt's files as the control plane's copy has them (rank 0's, and each
    other rank's of a gang), kept current by the agents' reports."""

    def __init__(
        self,
        directory: NodeDirectory,
        artifacts_dir: Path,
        offline_after_s: float,
        wakes: NodeWakes,
    ) -> None:
        self.directory = directory
        self.wakes = wakes
        self.artifacts_dir = artifacts_dir
        self.offline_after_s = offline_after_s

    def collect_in_place(self, handle: RunHandle, copy: CopyArtifacts) -> CollectResult:
        return self.collect(handle, Path("."), copy)

    def collect(
        self, handle: RunHandle, dest: Path, copy: CopyArtifacts | None = None
    ) -> CollectResult:
        """What the control plane has of the attempt (rank 0's, and each other rank's under
        nodes/RANK/), after asking each node for what it still holds. A node that cannot send
        the rest is said in one line per rank; what is here is delivered all the same."""
        from orbit.core.execution.artifacts import copy_artifacts

        copy = copy or copy_artifacts
        ranks = [(0, handle), *enumerate(other_ranks(handle, self.artifacts_dir), start=1)]
        asked = [(rank, h, self._ask(h)) for rank, h in ranks]
        got: CollectResult | None = None
        for rank, member, ask in asked:
            where = Path(member.location)
            why = self._await(member, where, ask)
            sub = dest if rank == 0 else dest / "nodes" / str(rank)
            if rank and not (where / "artifacts").is_dir():
                more = CollectResult(dest=sub)
            else:
                more = copy(where / "artifacts", sub, skip=is_scratch)
            if why is not None:
                more = more.and_problem(why)
            got = more if got is None else got.and_rank(rank, more)
        assert got is not None
        return got

    def _ask(self, handle: RunHandle) -> bool:
        """Ask the node for every file it still holds (large ones wait there for collect);
        False when everything is in already."""
        if read_agent_state(Path(handle.location)).get("complete"):
            return False
        node_id = str(handle.data.get("node_id", ""))
        self.directory.commands.enqueue_command(
            node_id, {"kind": "upload", "attempt_id": handle.attempt_id}, handle.attempt_id
        )
        self.wakes(node_id)
        return True

    def _await(self, handle: RunHandle, folder: Path, asked: bool) -> str | None:
        """Wait for what the node sends while it keeps coming: None once all is in, else why
        the rest will not come (said within seconds when the node cannot send it)."""
        if not asked:
            return None
        node_id = str(handle.data.get("node_id", ""))
        moved, idle_since = _size_of(folder), time.monotonic()
        deadline = idle_since + COLLECT_MAX_S
        while True:
            state = read_agent_state(folder)
            if state.get("complete"):
                return None
            if state.get("alive") and not state.get("ended"):
                return None  # still running: what it has sent so far (it keeps writing)
            if time.monotonic() >= deadline:
                return _not_all(folder, f"not all of it came within {COLLECT_MAX_S:.0f}s")
            if state.get("gone") or state.get("lost"):
                return _not_all(folder, str(state.get("gone") or state.get("lost")))
            try:
                node = self.directory.nodes.get_node(node_id)
            except OrbitError:
                return _not_all(folder, f"node '{handle.target}' was removed")
            if not node.online(datetime.now(UTC), self.offline_after_s):
                return _not_all(folder, f"node '{node.name}' is offline: the rest waits there")
            size = _size_of(folder)
            if size != moved:
                moved, idle_since = size, time.monotonic()
            elif time.monotonic() - idle_since >= COLLECT_IDLE_S:
                return _not_all(
                    folder, f"node '{node.name}' sent nothing for {COLLECT_IDLE_S:.0f}s"
                )
            time.sleep(0.2)


def _size_of(folder: Path) -> int:
    """Bytes under `folder` so far: what a collect waits to see grow."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _not_all(folder: Path, why: str) -> str:
    """One line: why the rest of an attempt's files will not come, and which are missing
    (by its manifest, where the control plane has it)."""
    from orbit.core.execution.runtime_state import parse_json as parse

    manifest = parse(hostside.read_from(str(folder / "artifacts" / "manifest.json"), 0, -1))
    listed = [f.get("path", "") for f in (manifest or {}).get("files", ())]
    missing = [p for p in listed if not (folder / "artifacts" / p).is_file()]
    if not missing:
        return f"{why}; files it had not sent are not here"
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return f"{why}; {len(missing)} file(s) of its manifest are missing: {shown}"
