"""One dispatcher for owned and rented machines: a pool run whose template allows it
(`placement: {kind: agent_pool, overflow: [ssh]}`) goes to the in-house pool first and, when the
pool cannot take it now, to a registered SSH host, with what already runs there counted against
the host. End to end: a real `orbit server`, a real `orbit agent`, a real sshd on loopback."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from orbit.model.hosts import HostFacts
from orbit.store import Store
from tests.agent.test_pool_runs import ended, run_of
from tests.agents import AgentProc, wait_online
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server
from tests.sshd import SshdFactory

OVERFLOW = {
    "id": "pool-or-rental",
    "description": "The in-house pool; a registered SSH host when the pool is full.",
    "placement": {"kind": "agent_pool", "selector": {}, "overflow": ["ssh"]},
    "launch_mode": {"kind": "host_process"},
    "defaults": {"target": None, "detach": True, "resources": {"gpu_count": 0}},
    "allow_overrides": ["resources", "runtime_env"],
}


def submit(server: Server, folder: Path, command: str, template: str) -> str:
    spec = write_spec(
        folder,
        name=f"spec-{time.monotonic_ns()}.yaml",
        template=template,
        task={"command": command},
    )
    return str(orbit_json(server.env(), "submit", str(spec))["id"])


def where(server: Server, run_id: str) -> tuple[str, str] | None:
    handle = run_of(server, run_id)["attempts"][-1]["handle"]
    return (handle["backend_key"], handle["target"]) if handle else None


def test_a_pool_run_overflows_to_an_ssh_host_only_when_the_pool_is_full(
    start_server: Callable[..., Server],
    start_agent: Callable[..., AgentProc],
    sshd_factory: SshdFactory,
    tmp_path: Path,
) -> None:
    box = sshd_factory(alias="box")
    env = {"ORBIT_SSH_CONFIG": str(sshd_factory.config)}
    server = start_server(env=env)
    templates = server.home / "templates"
    templates.mkdir(parents=True, exist_ok=True)
    (templates / "pool-or-rental.yaml").write_text(yaml.safe_dump(OVERFLOW), encoding="utf-8")
    orbit(server.env(), "hosts", "add", "box", "--ssh", box.alias, "--work-dir", str(box.work_root))
    start_agent(server, "inhouse", max_tasks=1)
    wait_online(server, "inhouse")
    gate = tmp_path / "gate"  # the tasks hold their slots until it exists

    def held(name: str) -> str:
        return f"echo {name} on $(hostname); while [ ! -e {gate} ]; do sleep 0.2; done"

    # the pool has a free slot: the first run takes it, in-house
    first = submit(server, tmp_path, held("first"), "pool-or-rental")
    eventually(lambda: where(server, first), timeout=60)
    assert where(server, first) == ("agent_pool_host_process", "inhouse")
    # the pool is full: the second overflows to the SSH host (one slot: it has no GPU)
    second = submit(server, tmp_path, held("second"), "pool-or-rental")
    eventually(lambda: where(server, second), timeout=60)
    assert where(server, second) == ("ssh_host_process", "box")
    # both full: a third with overflow waits, counted against the host's slot; a plain pool
    # run never goes to the host, whatever the pool's load
    third = submit(server, tmp_path, held("third"), "pool-or-rental")
    plain = submit(server, tmp_path, "echo plain", "pool")
    time.sleep(3)  # several passes: neither is placed
    assert where(server, third) is None and where(server, plain) is None
    explained = orbit(server.env(), "explain", second).stdout
    assert "box" in explained, explained
    replayed = orbit(server.env(), "explain", second, "--replay").stdout
    assert "identical" in replayed, replayed

    gate.touch()
    names = {first: "first", second: "second", third: "third", plain: "plain"}
    runs: dict[str, Any] = {}
    for run_id, name in names.items():
        try:
            runs[run_id] = ended(server, run_id, timeout=120)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}\n{server.output()[-4000:]}") from None
    for run_id, run in runs.items():
        assert run["attempts"][-1]["state"] == "succeeded", (run_id, run["attempts"][-1])
    assert orbit(server.env(), "logs", second).stdout.startswith("second on ")
    # the audit says it overflowed, from which pool to which host
    events = orbit_json(server.env(), "audit", "--run", second)
    assert any(e["action"] == "attempt.overflowed" and e["data"]["host"] == "box" for e in events)
    # the host's slot, freed by the second, went to the third or the pool's did
    assert where(server, third) in {
        ("ssh_host_process", "box"),
        ("agent_pool_host_process", "inhouse"),
    }


def test_a_run_overflowed_onto_a_host_that_does_not_answer_is_retried_through_the_pool(
    start_server: Callable[..., Server], start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    server = start_server()
    templates = server.home / "templates"
    templates.mkdir(parents=True, exist_ok=True)
    (templates / "pool-or-rental.yaml").write_text(yaml.safe_dump(OVERFLOW), encoding="utf-8")
    # a rental whose last check was fine, gone since: nothing listens on port 1
    orbit(
        server.env(),
        "hosts",
        "add",
        "gone",
        "--ssh",
        "nobody@127.0.0.1",
        "--port",
        "1",
        "--no-check",
        "--unreachable-timeout",
        "3",
    )
    store = Store(server.database_url)
    try:
        facts = HostFacts(checked_at=datetime.now(UTC), python_path="/usr/bin/python3", rsync=True)
        store.hosts.set_facts("gone", facts, "tests")
    finally:
        store.close()
    start_agent(server, "inhouse", max_tasks=1)
    wait_online(server, "inhouse")
    gate = tmp_path / "gate"
    first = submit(server, tmp_path, f"while [ ! -e {gate} ]; do sleep 0.2; done", "pool-or-rental")
    eventually(lambda: where(server, first), timeout=60)
    spec = write_spec(
        tmp_path,
        name="second.yaml",
        template="pool-or-rental",
        task={"command": "echo second"},
        retry={"max_retries": 1, "backoff_s": 0.5},
    )
    second = str(orbit_json(server.env(), "submit", str(spec))["id"])

    def overflowed() -> bool:
        attempt = run_of(server, second)["attempts"][0]
        return attempt["backend_key"] == "ssh_host_process" and attempt["target"] == "gone"

    eventually(overflowed, timeout=60)
    gate.touch()  # the pool has room again
    # the host never answers: the attempt there ends once its unreachable timeout is over,
    # and the retry goes back through the pool, where it runs
    run = ended(server, second, timeout=120)
    attempts = run["attempts"]
    given_up = (attempts[0]["state"], attempts[0]["reason"], attempts[0]["target"])
    assert given_up == ("terminated", "host_unreachable", "gone"), attempts[0]
    assert attempts[-1]["state"] == "succeeded", attempts[-1]
    assert attempts[-1]["handle"]["target"] == "inhouse", attempts[-1]
