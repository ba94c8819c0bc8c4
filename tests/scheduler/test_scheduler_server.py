"""The scheduler against a real `orbit server` and real agents (NVML replayed from a recording
of an H100 machine): decisions people can question (`orbit explain`, `--replay`, `orbit
queue`), ordered alternatives, tiers, quotas, and requests refused at submit."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.agent.test_gpus import H100, HOLD
from tests.agent.test_pool_runs import ended, run_of
from tests.agents import AgentProc, nvml_env, wait_online
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server


def submit(server: Server, folder: Path, command: str, *flags: str, **fields: Any) -> str:
    spec = write_spec(
        folder,
        name=f"spec-{time.monotonic_ns()}.yaml",
        template="pool",
        task={"command": command},
        **fields,
    )
    return str(orbit_json(server.env(), "submit", str(spec), *flags)["id"])


def message_becomes(server: Server, run_id: str, line: str, timeout: float = 30) -> None:
    def message() -> str:
        return str(run_of(server, run_id)["attempts"][-1]["message"] or "")

    try:
        eventually(lambda: message() == line, timeout)
    except AssertionError:
        assert message() == line  # says what it is instead


def started(server: Server, run_id: str) -> str | None:
    attempt = run_of(server, run_id)["attempts"][-1]
    return attempt["started_at"] if attempt["state"] in ("running", "succeeded") else None


def test_explain_says_why_a_run_waits_in_figures_and_replays_it_byte_for_byte(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    start_agent(orbit_server, "h100x2", max_tasks=4, env=nvml_env(H100))
    start_agent(orbit_server, "cpu-a", max_tasks=1)
    wait_online(orbit_server, "h100x2", "cpu-a")
    env = orbit_server.env()
    waiting = submit(
        orbit_server,
        tmp_path,
        "echo never",
        "--queue-anyway",
        overrides={"resources": {"gpu": "A100:2"}},
    )
    line = "0/2 nodes fit: 2 gpu model (need [A100-40GB, A100-80GB]:2, have H100-80GB or none)"
    message_becomes(orbit_server, waiting, line)
    shown = orbit(env, "explain", waiting).stdout
    assert "waiting: " + line in shown
    assert "h100x2: gpu model (need [A100-40GB, A100-80GB]:2, have H100-80GB)" in shown
    assert "cpu-a: gpu model (need [A100-40GB, A100-80GB]:2, have none)" in shown
    record = orbit_json(env, "explain", waiting)["decision"]
    assert record["outcome"] == "waiting" and record["tier"] == "normal"
    assert record["alternatives"][0]["counts"] == {"gpu_model": 2}
    replayed = orbit(env, "explain", waiting, "--replay")
    assert replayed.returncode == 0 and "replay: identical" in replayed.stdout
    queued = orbit_json(env, "queue")
    assert [(q["run"], q["tier"], q["reason"]) for q in queued] == [(waiting, "normal", line)]
    # an alternative that fits: GPU preferred, CPU acceptable
    either = submit(
        orbit_server,
        tmp_path,
        "echo cpu",
        overrides={"resources": {"any_of": [{"gpu": "A100"}, {"gpu": "none", "cpu_count": 1}]}},
    )
    assert ended(orbit_server, either)["attempts"][-1]["state"] == "succeeded"
    shown = orbit(env, "explain", either).stdout
    assert "(alternative 2)" in shown and "alternative 1: gpu [A100-40GB, A100-80GB]" in shown
    orbit(env, "cancel", waiting)


def test_the_more_urgent_tier_goes_first_when_a_slot_frees(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    agent = start_agent(orbit_server, "solo", max_tasks=1)
    wait_online(orbit_server, "solo")
    flag = tmp_path / "go"
    holder = submit(orbit_server, tmp_path, HOLD.format(flag=flag))
    eventually(lambda: started(orbit_server, holder), 60)
    batch = submit(orbit_server, tmp_path, "echo batch", priority="batch")
    urgent = submit(orbit_server, tmp_path, "echo urgent", priority="urgent")
    eventually(lambda: len(orbit_json(orbit_server.env(), "queue")) == 2, 30)
    queued = orbit_json(orbit_server.env(), "queue")
    assert [(q["run"], q["tier"], q["position"]) for q in queued] == [
        (urgent, "urgent", 1),
        (batch, "batch", 2),
    ]
    flag.touch()
    for run_id in (holder, batch, urgent):
        assert ended(orbit_server, run_id)["attempts"][-1]["state"] == "succeeded", agent.output()
    assert str(started(orbit_server, urgent)) < str(started(orbit_server, batch))


def test_a_run_over_its_quota_waits_with_the_figures(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    start_agent(orbit_server, "h100x2", max_tasks=4, env=nvml_env(H100))
    wait_online(orbit_server, "h100x2")
    env = orbit_server.env()
    orbit(env, "quotas", "set", "user", "admin", "--gpus", "1", "--weight", "2")
    listed = orbit_json(env, "quotas", "list")
    assert [(q["scope"], q["name"], q["gpus"], q["weight"]) for q in listed] == [
        ("user", "admin", 1, 2.0)
    ]
    over = submit(orbit_server, tmp_path, "echo two", overrides={"resources": {"gpu": "H100:2"}})
    line = "quota: user admin holds 0 of 1 gpus, asks 2"
    message_becomes(orbit_server, over, line)
    orbit(env, "quotas", "rm", "user", "admin")  # lifted: it runs
    assert ended(orbit_server, over)["attempts"][-1]["state"] == "succeeded"
    assert orbit_json(env, "quotas", "list") == []


def test_requests_the_scheduler_can_never_serve_are_refused_at_submit_in_one_line(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    start_agent(orbit_server, "h100x2", max_tasks=4, env=nvml_env(H100))
    wait_online(orbit_server, "h100x2")
    env = orbit_server.env()
    cases = {
        "resources.gpu: unknown accelerator model 'H10'; nearest known: H100, A10": {
            "overrides": {"resources": {"gpu": "H10:1"}}
        },
        "priority: unknown tier 'asap' (known: urgent, high, normal, batch)": {"priority": "asap"},
        "resources: no registered node could ever hold gpu H100-80GB:4": {
            "overrides": {"resources": {"gpu": "H100-80GB:4"}}
        },
        "resources.any_of: no registered node could ever hold": {
            "overrides": {"resources": {"any_of": [{"gpu": "A100"}, {"gpu": "T4"}]}}
        },
        "selector: no registered node has the labels rack=z": {
            "overrides": {"selector": {"rack": "z"}}
        },
        # a node that does not exist is named as such, with the ones that do (not capacity)
        "target: no node is named 'h100x3'; did you mean h100x2? (nodes: h100x2)": {
            "overrides": {"target": "h100x3"}
        },
        "target: no node is named 'nosuch' (nodes: h100x2)": {"overrides": {"target": "nosuch"}},
        "target: node h100x2 could never hold gpu H100-80GB:4; it has 2 GPU(s) (H100-80GB)": {
            "overrides": {"target": "h100x2", "resources": {"gpu": "H100-80GB:4"}}
        },
    }
    for expected, fields in cases.items():
        spec = write_spec(tmp_path, name="bad.yaml", template="pool", **fields)
        proc = orbit(env, "submit", str(spec), check=False)
        assert proc.returncode != 0, expected
        assert expected in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert orbit_json(env, "runs", "list") == [] or all(
        r["template_id"] != "pool" for r in orbit_json(env, "runs", "list")
    )


def test_simulate_says_what_another_config_would_have_changed(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    start_agent(orbit_server, "h100x2", max_tasks=4, env=nvml_env(H100))
    wait_online(orbit_server, "h100x2")
    env = orbit_server.env()
    run_id = submit(orbit_server, tmp_path, "echo one", overrides={"resources": {"gpu": "H100"}})
    assert ended(orbit_server, run_id)["attempts"][-1]["state"] == "succeeded"
    strict = tmp_path / "strict.yaml"
    strict.write_text("quotas:\n  - {user: admin, gpus: 0}\n", encoding="utf-8")
    report = json.loads(
        orbit(env, "sched", "simulate", "--since", "1h", "--config", str(strict), "--json").stdout
    )
    assert report["passes"] >= 1 and run_id in report["waiting_instead_of_placed"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("tiers: [a, a]\n", encoding="utf-8")
    proc = orbit(env, "sched", "simulate", "--config", str(bad), check=False)
    assert proc.returncode != 0 and "tiers" in proc.stderr and "Traceback" not in proc.stderr


def test_a_waiting_run_is_given_an_estimated_start_from_the_running_ones_progress(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    from datetime import UTC, datetime

    start_agent(orbit_server, "solo", max_tasks=1)
    wait_online(orbit_server, "solo")
    env = orbit_server.env()
    flag = tmp_path / "go"
    # step 1 of 4 logged, as trainers log it, then it holds: no max_runtime to go by
    progress = (
        'echo \'{"step": 1, "max_steps": 4, "loss": 2.0}\' > $ORBIT_ARTIFACTS_DIR/logging.jsonl'
    )
    holder = submit(orbit_server, tmp_path, f"{progress}; {HOLD.format(flag=flag)}")
    eventually(lambda: started(orbit_server, holder), 60)
    eventually(lambda: orbit_json(env, "status", holder)["progress"] is not None, 60)
    asked_at = datetime.now(UTC)
    waiting = submit(orbit_server, tmp_path, "echo next")
    eventually(lambda: len(orbit_json(env, "queue")) == 1, 30)
    [queued] = orbit_json(env, "queue")
    assert queued["run"] == waiting and queued["estimated_start"] is not None
    estimate = datetime.fromisoformat(queued["estimated_start"])
    # three more steps at the pace of the first (seconds), to the minute above
    assert 0 < (estimate - asked_at).total_seconds() <= 120
    flag.touch()
    assert ended(orbit_server, waiting)["attempts"][-1]["state"] == "succeeded"
