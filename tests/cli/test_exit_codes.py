"""The exit codes README's table and `orbit --help` promise, as a script sees them: the CLI as
a process, embedded and against a server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import orbit, sqlite_env, write_spec
from tests.orbit_server import Server, free_port

README = Path(__file__).resolve().parents[2] / "README.md"


def code(env: dict[str, str], *args: str) -> int:
    return orbit(env, *args, check=False).returncode


def test_the_codes_mean_what_the_readme_says_embedded(tmp_path: Path) -> None:
    env = sqlite_env(tmp_path / "home", tmp_path / "orbit.db")
    assert code(env, "submit", str(write_spec(tmp_path, "ok.yaml")), "--wait") == 0
    failing = write_spec(tmp_path, "bad.yaml", task={"command": "exit 4"})
    assert code(env, "submit", str(failing), "--wait") == 1  # ran, did not succeed
    broken = tmp_path / "broken.yaml"
    broken.write_text("experiment: e\ntask_type: command\n", encoding="utf-8")
    assert code(env, "submit", str(broken)) == 2  # bad input
    assert code(env, "status", "run-nosuchrun") == 2  # unknown
    assert code(env, "runs", "list", "-o", "nonsense") == 2
    # a server that does not answer
    away = {**env, "ORBIT_SERVER": f"http://127.0.0.1:{free_port()}", "ORBIT_TOKEN": "x"}
    assert code(away, "runs", "list") == 3
    help_text = " ".join(orbit(env, "--help").stdout.split())
    assert "Exit codes: 0 done;" in help_text and "3 a host, cluster or server" in help_text
    table = README.read_text(encoding="utf-8").split("### Exit codes", 1)[1][:1500]
    for row in ("| 0 |", "| 1 |", "| 2 |", "| 3 |", "| 130 |"):
        assert row in table


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_against_a_server_a_wrong_token_is_2_and_an_unknown_run_too(
    orbit_server: Server,
) -> None:
    assert code(orbit_server.env(), "status", "run-nosuchrun") == 2
    assert code(orbit_server.env(token="orbit_wrong"), "runs", "list") == 2
