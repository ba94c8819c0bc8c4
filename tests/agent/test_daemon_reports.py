"""The agent's reports while an attempt is being started: until its wrapper holds its lock (the
bundle is being fetched and staged, the wrapper forks), the attempt is alive to the server.
Reported as not alive then, the server judged a healthy start `runtime_lost` ("the runtime
wrapper is gone without writing a result (last state: starting)") and ran a retry beside it."""

from __future__ import annotations

from pathlib import Path

from orbit.agent.reports import build_report
from orbit.agent.state import AgentOptions, AgentState
from orbit.agent.sync import running
from orbit.agent.tracked import Tracked, has_ended


def agent_with(tmp_path: Path, tracked: Tracked) -> AgentState:
    agent = AgentState(AgentOptions(server="http://127.0.0.1:9", work_dir=tmp_path / "work"))
    agent.identity = {"node_id": "node-1", "name": "n1", "credential": "c"}
    agent.tracked[tracked.attempt_id] = tracked
    return agent


def attempt(tmp_path: Path, launching: bool) -> Tracked:
    folder = tmp_path / "work" / "attempts" / "a1"
    (folder / "runtime").mkdir(parents=True)  # staged; no wrapper holds runtime/lock yet
    (folder / "runtime" / "lock").touch()
    return Tracked("a1", "r1", 1, folder, "host_process", True, launching=launching)


def test_an_attempt_being_started_is_reported_alive_and_not_ended(tmp_path: Path) -> None:
    tracked = attempt(tmp_path, launching=True)
    agent = agent_with(tmp_path, tracked)
    try:
        report = build_report(agent)
        assert report is not None
        (reported,) = report.attempts
        assert reported.alive and not reported.ended
        (now,) = running(agent)
        assert now.alive and not now.ended
        assert not has_ended(tracked)  # it counts against max_tasks
        # once started, the wrapper's lock says: here, nobody holds it, so it is gone
        tracked.launching = False
        report = build_report(agent)
        assert report is not None and not report.attempts[0].alive
        assert has_ended(tracked)
    finally:
        agent.http.close()
        agent.workers.shutdown()
        agent.urgent.shutdown()
