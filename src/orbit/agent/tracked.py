"""An attempt the agent runs (or ran and still uploads): what it keeps of it in memory and in
its marker file beside the attempt's folder, and how it writes an end the wrapper never did."""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orbit.agent.files import FileState
from orbit.runtime import hostside

log = logging.getLogger("orbit.agent")


@dataclass
class Tracked:
    """An attempt this agent runs, or ran and is still uploading."""

    attempt_id: str
    run_id: str
    fence: int
    folder: Path
    launch_mode: str
    upload_large: bool
    files: dict[str, FileState] = field(default_factory=dict)
    done: bool = False
    everything: bool = False  # `orbit collect` asked: large files too
    launching: bool = False  # granted, its wrapper not started yet: it counts as alive
    swept: bool = False  # its wrapper died without a result and what it left was stopped

    def alive(self) -> bool:
        return self.launching or hostside.wrapper_alive(str(self.folder / "runtime"))

    def marker(self) -> dict[str, Any]:
        return {
            "attempt_id": self.attempt_id,
            "run_id": self.run_id,
            "fence": self.fence,
            "launch_mode": self.launch_mode,
            "upload_large": self.upload_large,
        }


def has_ended(t: Tracked) -> bool:
    return (t.folder / "runtime" / "result.json").exists() or not t.alive()


def pinned(t: Tracked) -> set[int]:
    try:
        text = (t.folder.parent / f"{t.attempt_id}.cpus").read_text()
    except OSError:
        return set()
    return {int(c) for c in text.split(",") if c.strip().isdigit()}


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{threading.get_ident()}.part")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def write_failed(folder: Path, reason: str, message: str) -> None:
    """An attempt that could not start on this node: its end, as the wrapper would write it."""
    from datetime import UTC, datetime

    runtime = folder / "runtime"
    runtime.mkdir(parents=True, exist_ok=True)
    (folder / "artifacts").mkdir(exist_ok=True)
    now = datetime.now(UTC).isoformat()
    write_json(
        runtime / "result.json",
        {"state": "failed", "reason": reason, "message": message, "finished_at": now},
    )
