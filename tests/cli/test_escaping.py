r"""Text from others is shown as text: a tenant's token name, a run's command and a refused
override carrying a screen-clearing escape, a carriage return and a newline reach an admin's
terminal spelled out (`\x1b[2J`, `\r`, `\n`), never as control characters and never as a
second table row; `--json` keeps the exact value. Real CLI processes against a real `orbit
server`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import write_spec
from tests.orbit_server import Server

EVIL = "ci\x1b[2J\rforged\nrow 2"
SPELLED = r"ci\x1b[2J\rforged\nrow 2"


def orbit(server: Server, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orbit", *args],
        env=server.env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def plain(proc: subprocess.CompletedProcess[str]) -> str:
    """Everything the process wrote, checked to hold no control character but line ends."""
    output = proc.stdout + proc.stderr
    assert not any((c < " " and c != "\n") or c == "\x7f" for c in output), repr(output)
    return output


def test_a_token_name_is_shown_escaped_in_every_table(orbit_server: Server, tmp_path: Path) -> None:
    made = orbit(orbit_server, tmp_path, "tokens", "create", "--name", EVIL, "--json")
    assert made.returncode == 0, made.stderr
    token_id = json.loads(made.stdout)["id"]

    listed = orbit(orbit_server, tmp_path, "tokens", "list")
    assert listed.returncode == 0, listed.stderr
    rows = plain(listed).splitlines()
    assert len(rows) == 3, rows  # the header, the admin's token, this one: no forged row
    ours = next(row for row in rows if row.startswith(token_id))
    assert SPELLED in ours

    audit = orbit(orbit_server, tmp_path, "audit")
    assert audit.returncode == 0, audit.stderr
    created = [row for row in plain(audit).splitlines() if "token.create" in row]
    assert any(SPELLED in row for row in created), created
    assert not any(row.startswith("row 2") for row in audit.stdout.splitlines())

    as_json = orbit(orbit_server, tmp_path, "tokens", "list", "--json")
    assert {t["name"] for t in json.loads(as_json.stdout)} >= {EVIL}  # JSON: exactly the value


def test_a_runs_command_and_an_error_line_are_shown_escaped(
    orbit_server: Server, tmp_path: Path
) -> None:
    ids = []
    for command in ("echo one", f"echo '{EVIL}'"):
        spec = write_spec(tmp_path, task={"command": command})
        submitted = orbit(orbit_server, tmp_path, "submit", str(spec), "--json")
        assert submitted.returncode == 0, submitted.stderr
        ids.append(json.loads(submitted.stdout)["id"])

    diff = orbit(orbit_server, tmp_path, "diff", *ids)
    assert diff.returncode == 0, diff.stderr
    rows = [row for row in plain(diff).splitlines() if row.startswith("task.request.command")]
    assert len(rows) == 1 and SPELLED in rows[0], diff.stdout

    dry = orbit(orbit_server, tmp_path, "submit", str(spec), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert any(SPELLED in row for row in plain(dry).splitlines() if "entrypoint" in row)

    refused = orbit(orbit_server, tmp_path, "submit", str(spec), "--set", f"{EVIL}=1")
    assert refused.returncode == 2
    said = plain(refused).strip().splitlines()
    assert len(said) == 1 and said[0].startswith("orbit: error: ") and SPELLED in said[0], said
