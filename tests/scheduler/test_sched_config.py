"""The scheduler config is safe to change on a running server: an edit of its file is picked
up without a restart, a typo leaves the last good config live (placement goes on) and is said
once, `orbit sched config set` validates before it writes, `show` prints what is in force,
and every change is audited with who, when and the diff. A real `orbit server`, a real agent
and the real CLI."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.agent.test_pool_runs import ended
from tests.agents import AgentProc, wait_online
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server

GOLD = "tiers: [urgent, gold, normal, batch]\n"
TYPO = "teirs: [urgent, gold, normal, batch]\n"
REFUSED = "teirs: unknown key; did you mean tiers?"


def pool_run(server: Server, folder: Path, priority: str) -> str:
    spec = write_spec(
        folder,
        name=f"spec-{time.monotonic_ns()}.yaml",
        template="pool",
        task={"command": "echo placed"},
        priority=priority,
    )
    return str(orbit_json(server.env(), "submit", str(spec))["id"])


def shown(server: Server) -> dict[str, Any]:
    return dict(orbit_json(server.env(), "sched", "config", "show"))


def invalid_metric(server: Server) -> float:
    with server.client() as http:
        text = http.get("/metrics").text
    [line] = [x for x in text.splitlines() if x.startswith("orbit_scheduler_config_invalid ")]
    return float(line.split()[1])


def sched_events(server: Server) -> list[dict[str, Any]]:
    return [e for e in orbit_json(server.env(), "audit") if e["action"] == "sched.config"]


def test_a_config_edited_while_the_server_runs_is_validated_picked_up_and_audited(
    start_server: Callable[..., Server], start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    server = start_server()  # no scheduler.yaml yet: the defaults
    start_agent(server, "solo", max_tasks=2)
    wait_online(server, "solo")
    env = server.env()
    assert shown(server)["text"] == "" and shown(server)["config"]["tiers"][0] == "urgent"
    refused = write_spec(tmp_path, name="gold.yaml", template="pool", priority="gold")
    assert "unknown tier 'gold'" in orbit(env, "submit", str(refused), check=False).stderr

    # made by hand after the start: picked up without a restart
    config = server.home / "scheduler.yaml"
    config.write_text(GOLD, encoding="utf-8")
    eventually(lambda: shown(server)["text"] == GOLD, 20)
    assert shown(server)["set_by"] == "file:root"
    assert ended(server, pool_run(server, tmp_path, "gold"))["attempts"][-1]["state"] == (
        "succeeded"
    )

    # a typo: the last good config stays live, placement goes on, and it is said once
    config.write_text(TYPO, encoding="utf-8")
    eventually(lambda: shown(server)["error"] is not None, 20)
    now = shown(server)
    assert now["error"] == f"{config}: {REFUSED}" and now["error_since"]
    assert now["text"] == GOLD and now["config"]["tiers"][1] == "gold"
    assert invalid_metric(server) == 1.0
    human = orbit(env, "sched", "config", "show").stdout
    assert "REFUSED since " in human and REFUSED in human and "tiers:\n- urgent\n- gold" in human
    placed = pool_run(server, tmp_path, "gold")
    assert ended(server, placed)["attempts"][-1]["state"] == "succeeded"
    time.sleep(2)  # a pass a second: the refusal is still said once, with no traceback
    log = server.output()
    assert log.count("scheduler config refused") == 1 and "Traceback" not in log, log

    # set: validated before anything is written; a mistake is one line naming the key
    bad = tmp_path / "bad.yaml"
    bad.write_text("tiers: [a]\npreemption: {enable: true}\n", encoding="utf-8")
    proc = orbit(env, "sched", "config", "set", str(bad), check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"orbit: error: {bad}: preemption.enable: unknown key; did you mean enabled?"
    ]
    assert config.read_text() == TYPO
    good = tmp_path / "good.yaml"
    good.write_text(GOLD + "scorer: spread\n", encoding="utf-8")
    orbit(env, "sched", "config", "set", str(good))
    after = shown(server)
    assert after["text"] == GOLD + "scorer: spread\n" and after["error"] is None
    assert after["set_by"] == "admin" and config.read_text() == after["text"]
    assert invalid_metric(server) == 0.0

    # every change, audited once with who and the diff
    events = sched_events(server)
    assert [(e["actor"], e["data"]["how"]) for e in events] == [
        ("file:root", "edited"),
        ("admin", "set"),
    ]
    assert "+tiers: [urgent, gold, normal, batch]" in events[0]["data"]["diff"]
    assert "-teirs" not in events[1]["data"]["diff"]  # from the last good, not the typo
    assert "+scorer: spread" in events[1]["data"]["diff"]


def test_a_member_may_not_set_it_and_a_restart_on_a_broken_file_keeps_the_last_good(
    start_server: Callable[..., Server], start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    server = start_server()
    admin = server.env()
    orbit(admin, "users", "add", "mia", "--role", "member")
    token = str(orbit_json(admin, "tokens", "create", "--user", "mia")["token"])
    good = tmp_path / "good.yaml"
    good.write_text(GOLD, encoding="utf-8")
    proc = orbit(server.env(token), "sched", "config", "set", str(good), check=False)
    assert proc.returncode == 2 and "mia (member) may not" in proc.stderr
    orbit(admin, "sched", "config", "set", str(good))
    server.stop()
    (server.home / "scheduler.yaml").write_text(TYPO, encoding="utf-8")
    again = start_server()
    start_agent(again, "solo", max_tasks=1)
    wait_online(again, "solo")
    now = shown(again)
    assert now["error"] is not None and REFUSED in now["error"]
    assert now["text"] == GOLD and "last good" in now["source"]
    assert ended(again, pool_run(again, tmp_path, "gold"))["attempts"][-1]["state"] == "succeeded"
    assert [e["actor"] for e in sched_events(again)] == ["admin"]  # a refusal changes nothing
