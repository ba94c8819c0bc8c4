"""`orbit agent install-service`: the systemd unit that keeps the agent running. The join token
goes into the agent's work dir (mode 0600), where the agent reads it once, joins, and removes
it: never into the unit, which anyone can read, nor into the agent's argv or environment, which
`ps` and every process it starts would see."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

TOKEN_FILE = "join-token"  # where install-service leaves the join token: the agent uses it once


def unit_text(argv: list[str], user: str | None) -> str:
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
    if join_token:
        work_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
        token_file = work_dir / TOKEN_FILE
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(f"{join_token}\n")
        os.chmod(token_file, 0o600)
        if user:
            shutil.chown(token_file, user)
        argv += ["--join-token-file", str(token_file)]
        written.append(token_file)
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(unit_text(argv, user))
    written.insert(0, unit)
    return written
