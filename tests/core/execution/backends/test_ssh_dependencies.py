"""Run dependencies on an SSH host: the gate is the control plane's, before any backend, so a
run for a rented host whose dependency has not ended stages nothing there and starts nothing,
and is staged and run once the dependency has succeeded. The real CLI, a real sshd on loopback."""

from __future__ import annotations

from pathlib import Path

from tests.core.execution.backends.test_ssh_host_process import add_host, spec_for
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.sshd import SshdFactory


def test_a_run_for_an_ssh_host_stages_nothing_until_its_dependency_succeeded(
    env: dict[str, str], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    server = sshd_factory(alias="h100-a")
    add_host(env, "h100-a", server)
    flag = tmp_path / "go"
    first = orbit_json(
        env,
        "submit",
        str(write_spec(tmp_path, task={"command": f"while [ ! -e {flag} ]; do sleep 0.1; done"})),
    )["id"]
    spec = spec_for(tmp_path / "remote", "h100-a", "echo ran on the host")
    then = orbit_json(env, "submit", str(spec), "--after", first)
    assert then["state"] == "prepared" and then["attempts"][0]["handle"] is None
    assert orbit_json(env, "status", then["id"])["attempts"][0]["held"] == "after"
    attempts = server.work_root / "attempts"
    assert not attempts.exists() or not any(attempts.iterdir())  # nothing staged or started

    flag.touch()
    done = eventually(
        lambda: (r := orbit_json(env, "status", then["id"]))["state"] == "succeeded" and r,
        timeout=60,
        every=0.3,
    )
    assert orbit_json(env, "status", first)["state"] == "succeeded"
    assert done["attempts"][0]["handle"]["target"] == "h100-a"
    assert orbit(env, "logs", then["id"]).stdout == "ran on the host\n"
