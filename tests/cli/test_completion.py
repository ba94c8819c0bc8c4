"""Shell completion as a shell asks for it (Typer's protocol, as `orbit --install-completion`
installs it): commands, run ids newest first, experiments, templates and node names; embedded
and through a real server, where a user is offered only what they may see."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from tests.helpers import orbit, orbit_json, sqlite_env, write_spec
from tests.orbit_server import Server
from tests.server.test_nodes_admin import join
from tests.server.test_permissions import token_for


def completed(env: dict[str, str], line: str) -> list[str]:
    """What the shell would offer for the last word of `line` (a trailing space: a new one)."""
    import subprocess

    words = line.split(" ")
    asked = {**env, "_ORBIT_COMPLETE": "complete_bash", "COMP_WORDS": line}
    asked["COMP_CWORD"] = str(len(words) - 1)
    # the installed command: the shell calls it by its name, which names the variable
    command = str(Path(sys.executable).parent / "orbit")
    proc = subprocess.run([command], env=asked, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return [w for w in proc.stdout.splitlines() if w]


def test_embedded_completion_offers_runs_experiments_and_templates(
    orbit_home: Path, tmp_path: Path
) -> None:
    database = tmp_path / "orbit.db"
    env = sqlite_env(orbit_home, database)
    # before any store: nothing offered, nothing said, and no store made for it
    assert completed(env, "orbit status ") == []
    assert not database.exists()
    assert completed(env, "orbit sta") == ["status"]

    first = orbit_json(env, "submit", str(write_spec(tmp_path, experiment="alpha")))["id"]
    second = orbit_json(env, "submit", str(write_spec(tmp_path, experiment="beta")))["id"]
    assert completed(env, "orbit status run-") == [second, first]  # the newest first
    assert completed(env, f"orbit logs {first[:9]}") == [first] or first[:9] == second[:9]
    assert completed(env, "orbit runs list --experiment a") == ["alpha"]
    assert completed(env, "orbit cancel --experiment ") == ["alpha", "beta"]
    assert "local" in completed(env, "orbit templates show lo")
    assert completed(env, "orbit diff run-zzz") == []
    assert completed(env, "orbit nodes show ") == []


def test_completion_through_a_server_offers_what_the_user_may_see(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    server = start_server()
    admin = server.env()
    ann = server.env(token_for(server, "ann", "member"))
    orbit(admin, "experiments", "create", "secret-x")
    orbit(admin, "experiments", "restrict", "secret-x")
    hidden = orbit_json(admin, "submit", str(write_spec(tmp_path, experiment="secret-x")))["id"]
    seen = orbit_json(admin, "submit", str(write_spec(tmp_path, experiment="open-y")))["id"]
    token = orbit_json(admin, "nodes", "join-token", "create")["token"]
    join(server, token, "gpu-a").close()

    assert completed(admin, "orbit status run-") == [seen, hidden]
    assert completed(ann, "orbit status run-") == [seen]  # not a restricted one's
    assert completed(ann, "orbit runs list --experiment ") == ["open-y"]
    assert completed(ann, "orbit nodes drain g") == ["gpu-a"]
    assert "pool" in completed(ann, "orbit templates show ")
    # a server that does not answer: nothing offered, and no error in the shell's line
    gone = {**ann, "ORBIT_SERVER": "http://127.0.0.1:9"}
    assert completed(gone, "orbit status run-") == []
    assert os.environ.get("_ORBIT_COMPLETE") is None
