"""kubectl's `-o json|yaml|wide|name` on listings, through the CLI as a process, embedded and
against a real server: json is --json, yaml the same data, name one id a line (for xargs),
wide the table with more columns; an unknown format is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import orbit, orbit_json, sqlite_env, write_spec
from tests.orbit_server import Server


def check_formats(env: dict[str, str], folder: Path) -> None:
    # ended before the listings are compared: a run still moving changes between two looks
    run_id = orbit_json(env, "submit", str(write_spec(folder)), "--wait")["id"]
    as_json = orbit_json(env, "runs", "list")
    assert json.loads(orbit(env, "runs", "list", "-o", "json").stdout) == as_json
    assert yaml.safe_load(orbit(env, "runs", "list", "-o", "yaml").stdout) == as_json
    assert orbit(env, "runs", "list", "-o", "name").stdout.split() == [run_id]
    wide = orbit(env, "runs", "list", "-o", "wide").stdout
    assert "BUNDLE" in wide and as_json[0]["bundle"]["digest"][:12] in wide
    assert "BUNDLE" not in orbit(env, "runs", "list").stdout
    assert orbit(env, "experiments", "list", "--output", "name").stdout.split() == ["exp"]
    assert "local" in orbit(env, "templates", "list", "-o", "name").stdout.split()
    assert orbit(env, "queue", "-o", "name").stdout == ""  # nothing waits: nothing printed
    bad = orbit(env, "runs", "list", "-o", "table", check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip() == (
        "orbit: error: -o table: unknown format (expected one of: json, yaml, wide, name)"
    )


def test_formats_embedded(tmp_path: Path) -> None:
    check_formats(sqlite_env(tmp_path / "home", tmp_path / "orbit.db"), tmp_path)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_formats_against_a_server(orbit_server: Server, tmp_path: Path) -> None:
    env = {**orbit_server.env(), "COLUMNS": "200"}
    check_formats(env, tmp_path)
    assert orbit(env, "users", "list", "-o", "name").stdout.split() == ["admin"]
    assert yaml.safe_load(orbit(env, "nodes", "list", "-o", "yaml").stdout) == []
