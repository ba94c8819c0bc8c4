"""`orbit agent install-service`: the systemd unit that keeps the agent running. The join token
goes to an environment file beside it (mode 0600), never into the unit, which anyone can read."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path


def unit_text(argv: list[str], user: str | None, env_file: Path | None) -> str:
    lines = [
        "[Unit]",
        "Description=ORBIT agent (connects out to the orbit server; listens on no port)",
        "Wants=network-online.target",
        "After=network-online.target docker.service",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={shlex.join(argv)}",
        "Restart=always",
        "RestartSec=2",
        # what the agent started goes on when the agent stops: a restarted agent picks it up
        "KillMode=process",
        "TimeoutStopSec=15",
    ]
    if user:
        lines.append(f"User={user}")
    if env_file is not None:
        lines.append(f"EnvironmentFile=-{env_file}")
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


def write_unit(
    unit: Path,
    *,
    server: str,
    join_token: str | None,
    name: str | None,
    labels: str | None,
    max_tasks: int,
    work_dir: Path,
    user: str | None,
    orbit: Path | None,
) -> list[Path]:
    program = str(orbit) if orbit and orbit.name == "orbit" else shutil.which("orbit") or "orbit"
    argv = [program, "agent", "--server", server, "--work-dir", str(work_dir)]
    argv += ["--max-tasks", str(max_tasks)]
    if name:
        argv += ["--name", name]
    if labels:
        argv += ["--labels", labels]
    written = []
    env_file = None
    if join_token:
        env_file = unit.with_suffix(".env")
        env_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(f"ORBIT_JOIN_TOKEN={join_token}\n")
        written.append(env_file)
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(unit_text(argv, user, env_file))
    written.insert(0, unit)
    return written
