"""`orbit agent install-service`: the unit runs the agent with the given options, and the join
token lands in an environment file only its owner can read, never in the unit."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tests.helpers import orbit


def test_install_service_writes_a_unit_and_keeps_the_token_out_of_it(tmp_path: Path) -> None:
    unit = tmp_path / "systemd" / "orbit-agent.service"
    env = {**os.environ, "ORBIT_HOME": str(tmp_path / "home")}
    given = tmp_path / "join.token"
    given.write_text("orbitjoin_secret\n")
    work = tmp_path / "work"
    said = orbit(
        env,
        "agent",
        "install-service",
        "--server",
        "https://orbit.lab:8470",
        "--join-token-file",
        str(given),
        "--labels",
        "gpu=h100",
        "--max-tasks",
        "4",
        "--work-dir",
        str(work),
        "--unit",
        str(unit),
    ).stdout
    text = unit.read_text()
    assert "orbitjoin_secret" not in text
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    for part in ("agent --server https://orbit.lab:8470", "--max-tasks 4", "--labels gpu=h100"):
        assert part in exec_start, exec_start
    assert "KillMode=process" in text  # a restart of the agent leaves its runs running
    # the token waits in the work dir, for the agent's user alone, and the agent is told
    # where (it reads it once, joins, and removes it): never in the unit, argv or environment
    token_file = work / "join-token"
    assert token_file.read_text() == "orbitjoin_secret\n"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert f"--join-token-file {token_file}" in exec_start
    assert "Environment" not in text and not unit.with_suffix(".env").exists()
    assert "systemctl daemon-reload && systemctl enable --now orbit-agent" in said


def test_a_join_token_is_never_taken_from_the_command_line(tmp_path: Path) -> None:
    """`--join-token VALUE` would sit in `ps` for the agent's whole life and in the shell's
    history: refused in one line that says what to do instead, and nothing is written."""
    env = {**os.environ, "ORBIT_HOME": str(tmp_path / "home")}
    for command in (["agent"], ["agent", "install-service", "--unit", str(tmp_path / "u")]):
        proc = orbit(
            env,
            *command,
            "--server",
            "https://x",
            "--join-token",
            "orbitjoin_secret",
            "--work-dir",
            str(tmp_path / "work"),
            check=False,
        )
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().startswith("orbit: error: --join-token: a token on the"), (
            proc.stderr
        )
        assert "--join-token-file" in proc.stderr and "orbitjoin_secret" not in proc.stderr
    assert not (tmp_path / "work").exists() and not (tmp_path / "u").exists()


def test_install_service_refuses_bad_labels_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "ORBIT_HOME": str(tmp_path / "home")}
    proc = orbit(
        env,
        "agent",
        "install-service",
        "--server",
        "https://x",
        "--labels",
        "nope",
        "--unit",
        str(tmp_path / "u.service"),
        check=False,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("orbit: error: --labels: 'nope'"), proc.stderr
    assert not (tmp_path / "u.service").exists()
