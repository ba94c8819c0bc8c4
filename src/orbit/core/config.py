"""Where ORBIT keeps its state: $ORBIT_HOME (default ~/.orbit) and the store's URL; or, in
server mode, which `orbit server` to talk to and the token to show it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from orbit.core.errors import InvalidInput


@dataclass(frozen=True)
class Settings:
    home: Path
    database_url: str
    ssh_config: Path | None = None  # ORBIT_SSH_CONFIG: an ssh config file instead of ~/.ssh/config
    ssh_timeout_s: float = 15.0  # ORBIT_SSH_TIMEOUT: to connect, and silence that means a drop
    server: str | None = None  # ORBIT_SERVER (or `orbit login`): talk to this orbit server
    token: str | None = None  # ORBIT_TOKEN (or `orbit login`): the token to show it

    @property
    def credentials_file(self) -> Path:
        """Where `orbit login` keeps the server's URL and its token (mode 0600)."""
        return self.home / "credentials.json"

    @property
    def bundles_dir(self) -> Path:
        """The content-addressed cache of frozen bundles, one folder per digest."""
        return self.home / "bundles"

    @property
    def work_dir(self) -> Path:
        """Where local attempts execute, one extracted bundle per attempt."""
        return self.home / "work"

    @property
    def templates_dir(self) -> Path:
        return self.home / "templates"

    @classmethod
    def from_env(cls) -> Settings:
        home = orbit_home()
        url = os.environ.get("ORBIT_DATABASE_URL") or f"sqlite:///{home / 'orbit.db'}"
        ssh_config = os.environ.get("ORBIT_SSH_CONFIG")
        timeout = os.environ.get("ORBIT_SSH_TIMEOUT")
        try:
            ssh_timeout = float(timeout) if timeout else 15.0
        except ValueError:
            raise InvalidInput(f"ORBIT_SSH_TIMEOUT: expected seconds, got {timeout!r}") from None
        server = os.environ.get("ORBIT_SERVER") or None
        token = os.environ.get("ORBIT_TOKEN") or None
        saved = _saved_login(home / "credentials.json")
        if server is None and saved.get("server"):
            server = saved["server"]
        if token is None and server is not None and saved.get("server") == server:
            token = saved.get("token")
        return cls(
            home=home.absolute(),
            database_url=url,
            ssh_config=Path(ssh_config).expanduser() if ssh_config else None,
            ssh_timeout_s=ssh_timeout,
            server=server.rstrip("/") if server else None,
            token=token,
        )


def orbit_home() -> Path:
    """$ORBIT_HOME, default ~/.orbit."""
    return Path(os.environ.get("ORBIT_HOME") or Path.home() / ".orbit").expanduser()


def _saved_login(path: Path) -> dict[str, str]:
    """What `orbit login` saved: {"server": URL, "token": T}, or nothing."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise InvalidInput(
            f"{path}: not the file `orbit login` writes ({exc}); remove it and log in again"
        ) from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: not the file `orbit login` writes; remove it, log in again")
    return {k: v for k, v in data.items() if isinstance(v, str)}


def save_login(path: Path, server: str, token: str) -> None:
    """Write the login for `server`, readable by its owner only (written 0600 from the start,
    never world-readable for a moment), replacing the file in one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump({"server": server.rstrip("/"), "token": token}, out)
    os.replace(tmp, path)
