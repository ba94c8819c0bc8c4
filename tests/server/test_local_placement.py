"""The server's own host is not a member's shell: on `orbit server`, a template whose placement
runs there (`local`: the built-in local and local-docker templates, or any other) is for admins
only, unless the server setting local_roles names members too. A member's submit, dry run,
replay and retry into one are refused in one line naming the setting, and nothing is kept."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import yaml

from tests.helpers import ORBIT, eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server


def _token(server: Server, user: str, role: str) -> str:
    admin = server.env()
    orbit(admin, "users", "add", user, "--role", role)
    return str(orbit_json(admin, "tokens", "create", "--user", user)["token"])


def _refusal(template: str) -> str:
    return (
        f"orbit: error: mia (member) may not run template '{template}': it runs on the server's "
        "own host, which only admins may use (server setting local_roles)\n"
    )


def test_a_member_may_not_submit_to_or_replay_on_the_servers_own_host(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    server = start_server()
    admin = server.env()
    token = _token(server, "mia", "member")
    member = server.env(token)
    steal = write_spec(tmp_path, task={"command": 'cat "$ORBIT_HOME/admin-token"'})
    docker = write_spec(tmp_path, "docker.yaml", template="local-docker", task={"command": "id"})
    # any template whose placement is the server's own host, whatever its name
    templates = server.home / "templates"
    templates.mkdir()
    builtin = resources.files("orbit.model") / "builtin_templates" / "local.yaml"
    (templates / "here.yaml").write_text(
        yaml.safe_dump({**yaml.safe_load(builtin.read_text()), "id": "here"})
    )
    here = write_spec(tmp_path, "here.yaml", template="here", task={"command": "id"})

    for spec, template in ((steal, "local"), (docker, "local-docker"), (here, "here")):
        for dry in ((), ("--dry-run",)):
            refused = orbit(member, "submit", str(spec), *dry, check=False)
            assert (refused.returncode, refused.stderr) == (2, _refusal(template)), refused
    assert orbit_json(admin, "runs", "list") == []  # nothing was recorded
    assert not any("run.created" in e["action"] for e in orbit_json(admin, "audit"))

    # an admin's run there is not the member's to replay (CLI and API say the same)
    theirs = orbit_json(admin, "submit", str(write_spec(tmp_path, task={"command": "true"})))
    refused = orbit(member, "replay", theirs["id"], check=False)
    assert (refused.returncode, refused.stderr) == (2, _refusal("local")), refused
    with server.client(token) as http:
        answer = http.post(f"/api/v1/runs/{theirs['id']}/replay")
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"] == "Forbidden" and "local_roles" in answer.json()["detail"]
    assert [r["id"] for r in orbit_json(admin, "runs", "list")] == [theirs["id"]]

    # a member still submits where the server's host is not the place (the checks after the
    # gate then answer as always: here, no agent node can ever take it)
    pool = write_spec(tmp_path, "pool.yaml", template="pool", task={"command": "true"})
    elsewhere = orbit(member, "submit", str(pool), "--dry-run", check=False)
    assert "local_roles" not in elsewhere.stderr, elsewhere


def test_local_roles_lets_members_in_and_a_retry_is_checked_against_it_again(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(json.dumps({"local_roles": ["member"]}), encoding="utf-8")
    server = start_server("--config", str(config))
    token = _token(server, "mia", "member")
    member = server.env(token)
    spec = write_spec(tmp_path, task={"command": "true"})
    assert orbit_json(member, "submit", str(spec), "--dry-run")["template_id"] == "local"
    run = orbit_json(member, "submit", str(spec))
    with server.client(token) as http:

        def ended() -> bool:
            attempts = http.get(f"/api/v1/runs/{run['id']}").json()["attempts"]
            return bool(attempts[-1]["state"] == "succeeded")

        eventually(ended)

    # the server restarts with the default: the member's own run is no longer theirs to retry
    server.stop()
    again = start_server()
    member = again.env(token)
    refused = orbit(member, "retry", run["id"], check=False)
    assert (refused.returncode, refused.stderr) == (2, _refusal("local")), refused
    assert len(orbit_json(again.env(), "runs", "show", run["id"])["attempts"]) == 1
    assert len(orbit_json(again.env(), "retry", run["id"])["attempts"]) == 2  # an admin may


def test_a_viewer_in_local_roles_is_refused_by_name(tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(json.dumps({"local_roles": ["viewer"]}), encoding="utf-8")
    started = subprocess.run(
        [*ORBIT, "server", "--config", str(config), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 2, started
    assert started.stderr == (
        f"orbit: error: {config}: local_roles: a viewer submits nothing: name admin and "
        "member only\n"
    )
