"""A pool attempt whose bundle takes a while to fetch and stage on its node: granted its start,
its wrapper not yet running. Real `orbit server` and `orbit agent` processes, SQLite and
PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agent.test_pool_runs import ended
from tests.agents import AgentProc, wait_online
from tests.helpers import orbit, orbit_json, write_spec
from tests.orbit_server import Server


@pytest.fixture(autouse=True)
def _quick_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORBIT_NODE_HEARTBEAT_S", "1")


def test_an_attempt_still_staging_is_not_taken_for_lost(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    """Its node reports nothing of it until its wrapper runs: before the fix, it reported the
    wrapper not alive, and the server ended the attempt as runtime_lost while it staged."""
    agent = start_agent(orbit_server, "slow")
    wait_online(orbit_server, "slow")
    work = tmp_path / "data"
    work.mkdir()
    for i in range(4):  # incompressible, so fetching and unpacking it take their time
        (work / f"blob-{i}.bin").write_bytes(os.urandom(24 << 20))
    task = {"command": "ls blob-*.bin | wc -l", "workdir": str(work)}
    spec = write_spec(tmp_path, template="pool", task=task)
    run_id = str(orbit_json(orbit_server.env(), "submit", str(spec))["id"])
    attempts = ended(orbit_server, run_id, timeout=120)["attempts"]
    assert [(a["state"], a["reason"]) for a in attempts] == [("succeeded", None)], (
        attempts,
        agent.output()[-3000:],
    )
    assert orbit(orbit_server.env(), "logs", run_id).stdout.split() == ["4"]
