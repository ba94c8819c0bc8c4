"""Where ORBIT keeps its state: $ORBIT_HOME (default ~/.orbit) and the store's URL."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    home: Path
    database_url: str

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
        return cls(home=home.absolute(), database_url=url)
