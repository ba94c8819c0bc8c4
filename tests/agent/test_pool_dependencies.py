"""Run dependencies on an agent pool: real `orbit server` and `orbit agent` processes, the real
CLI, SQLite and PostgreSQL. The gate is the control plane's, before placement: a pool run whose
dependency has not ended is not placed though a node has room (no scheduler decision, shown
held in `orbit queue`), and is placed and run once it has succeeded; under `ok`, a dependency's
failure fails it without ever reaching a node."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tests.agent.test_pool_runs import ended, run_of, submit
from tests.agents import AgentProc, wait_online
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server


def test_a_pool_run_waits_for_its_dependencies_though_a_node_has_room(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    env = orbit_server.env()
    start_agent(orbit_server, "solo", max_tasks=3)
    wait_online(orbit_server, "solo")
    flag, out = tmp_path / "go", tmp_path / "first.out"
    first = submit(
        orbit_server, tmp_path, f"while [ ! -e {flag} ]; do sleep 0.1; done; echo made > {out}"
    )
    doomed = submit(orbit_server, tmp_path, f"while [ ! -e {flag} ]; do sleep 0.1; done; exit 5")
    eventually(lambda: run_of(orbit_server, first)["attempts"][-1]["state"] == "running", 30)
    spec = write_spec(
        tmp_path,
        "then.yaml",
        template="pool",
        task={"command": f"cat {out}"},
        after={"ok": [first]},
    )
    then = str(orbit_json(env, "submit", str(spec))["id"])
    never = str(orbit_json(env, "submit", str(spec), "--after", doomed)["id"])

    time.sleep(2)  # scheduler passes go by: the node has a free slot, and it is not placed
    for run_id, waits in ((then, [first]), (never, [first, doomed])):
        attempt = run_of(orbit_server, run_id)["attempts"][-1]
        assert attempt["state"] == "prepared" and attempt["held"] == "after"
        assert attempt["handle"] is None
        (entry,) = [e for e in orbit_json(env, "queue") if e["run"] == run_id]
        assert entry["outcome"] == "held" and entry["waits_for"] == waits
        no_decision = orbit(env, "explain", run_id, check=False)
        assert no_decision.returncode == 2, no_decision.stderr
        assert (
            "has no scheduler decision yet: it is queued once its dependencies have ended ("
            "waiting for its dependencies to end (after.ok: " in no_decision.stderr
        )
    assert orbit_json(env, "nodes", "show", "solo")["running"] == [f"{first}-1", f"{doomed}-1"]

    flag.touch()
    assert ended(orbit_server, first)["attempts"][-1]["state"] == "succeeded"
    done = ended(orbit_server, then)
    assert done["attempts"][-1]["state"] == "succeeded", done["attempts"][-1]
    assert orbit(env, "logs", then).stdout == "made\n"
    failed = ended(orbit_server, never)["attempts"]
    assert [(a["state"], a["reason"]) for a in failed] == [("failed", "dependency_failed")]
    assert doomed in failed[0]["message"] and failed[0]["handle"] is None
    assert orbit_json(env, "queue") == []
