"""Where ORBIT keeps its state: $ORBIT_HOME (default ~/.orbit) and the store's URL."""

from __future__ import annotations

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
        home = Path(os.environ.get("ORBIT_HOME") or Path.home() / ".orbit").expanduser()
        url = os.environ.get("ORBIT_DATABASE_URL") or f"sqlite:///{home / 'orbit.db'}"
        ssh_config = os.environ.get("ORBIT_SSH_CONFIG")
        timeout = os.environ.get("ORBIT_SSH_TIMEOUT")
        try:
            ssh_timeout = float(timeout) if timeout else 15.0
        except ValueError:
            raise InvalidInput(f"ORBIT_SSH_TIMEOUT: expected seconds, got {timeout!r}") from None
        return cls(
            home=home.absolute(),
            database_url=url,
            ssh_config=Path(ssh_config).expanduser() if ssh_config else None,
            ssh_timeout_s=ssh_timeout,
        )
