"""agent_pool's status reads the control plane's copy of an attempt while reports land in it: a
report that ends the attempt between two of its reads must not make a finished run look like
a wrapper gone without a result."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from orbit.core.execution.backends import pool_status
from orbit.core.execution.backends.agent_pool import AgentPoolBackend
from orbit.core.execution.mirror import apply_chunk, write_agent_state
from orbit.model.models import RunHandle, RunState
from orbit.model.nodes import NodeRecord, NodeState

RESULT = {
    "state": "succeeded",
    "exit_code": 0,
    "started_at": "2026-01-01T00:00:00+00:00",
    "finished_at": "2026-01-01T00:00:01+00:00",
}


class OneNode:
    """The store as a pool backend sees it (NodeDirectory), with one node."""

    @property
    def nodes(self) -> OneNode:
        return self

    def get_node(self, ref: str) -> NodeRecord:
        now = datetime.now(UTC)
        return NodeRecord(
            id=ref,
            name="n1",
            labels={},
            info={},
            state=NodeState.ACTIVE,
            max_tasks=1,
            created_at=now,
            created_by="tests",
            last_seen_at=now,
        )


def test_a_report_landing_between_reads_is_seen_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "run-1-1"
    write_agent_state(folder, started=True, alive=True, node="n1", fence=1)
    status = {"state": "running", "updated_at": "2026-01-01T00:00:00+00:00"}
    apply_chunk(folder, "runtime/status.json", 0, json.dumps(status).encode(), replace=True)

    def land() -> None:
        """The last report, as the gateway applies it: its files, then agent.json."""
        apply_chunk(folder, "runtime/result.json", 0, json.dumps(RESULT).encode(), replace=True)
        write_agent_state(folder, alive=False, ended=True)

    reads = []

    def spy(real: Any) -> Any:
        def read(*args: Any) -> Any:
            found = real(*args)
            reads.append(args[0])
            if len(reads) == 1:
                land()  # right after status() made its first read
            return found

        return read

    monkeypatch.setattr(pool_status.hostside, "read_from", spy(pool_status.hostside.read_from))
    monkeypatch.setattr(pool_status, "read_agent_state", spy(pool_status.read_agent_state))
    backend = AgentPoolBackend("host_process", OneNode(), tmp_path)  # type: ignore[arg-type]
    handle = RunHandle(
        backend_key=backend.key,
        target="n1",
        attempt_id="run-1-1",
        location=str(folder),
        data={"node_id": "node-1", "fence": 1},
    )
    found = backend.status(handle)
    assert (found.state, found.reason) == (RunState.SUCCEEDED, None), (found, reads)
