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
    said = orbit(
        env,
        "agent",
        "install-service",
        "--server",
        "https://orbit.lab:8470",
        "--join-token",
        "orbitjoin_secret",
        "--labels",
        "gpu=h100",
        "--max-tasks",
        "4",
        "--work-dir",
        str(tmp_path / "work"),
        "--unit",
        str(unit),
    ).stdout
    text = unit.read_text()
    assert "orbitjoin_secret" not in text
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    for part in ("agent --server https://orbit.lab:8470", "--max-tasks 4", "--labels gpu=h100"):
        assert part in exec_start, exec_start
    assert "KillMode=process" in text  # a restart of the agent leaves its runs running
    env_file = unit.with_suffix(".env")
    assert env_file.read_text() == "ORBIT_JOIN_TOKEN=orbitjoin_secret\n"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert f"EnvironmentFile=-{env_file}" in text
    assert "systemctl daemon-reload && systemctl enable --now orbit-agent" in said


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
