"""A run's checkpoints by ORBIT's convention (README, "Preemption and resume"): an entry of
`checkpoints/`, a folder `checkpoint-*` up to two levels down, or a `checkpoint-*` of an
ms-swift run folder (`checkpoints/vN-DATE-TIME/checkpoint-500`); its step is the number at the
end of its name. Retention keeps the newest N of a run across its attempts (highest step, then
latest change) and never one that a retry would resume from."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from orbit.runtime.checkpoint_finder import newest_checkpoint

_STEP = re.compile(r"(\d+)(?:\.[A-Za-z0-9]+)?$")
_SWIFT_RUN = re.compile(r"^v\d+-")
SETTLE_S = 60.0  # a checkpoint changed this recently may still be being written: left alone


@dataclass(frozen=True, order=True)
class Checkpoint:
    step: int
    mtime: float
    relpath: str  # under the attempt's artifacts/
    attempt_id: str = ""


def _candidates(artifacts: Path) -> set[Path]:
    found: set[Path] = set()
    top = artifacts / "checkpoints"
    for entry in _entries(top):
        if _SWIFT_RUN.match(entry.name) and entry.is_dir():
            found.update(e for e in _entries(entry) if e.name.startswith("checkpoint-"))
        else:
            found.add(entry)
    for depth in ("*", "*/*"):
        found.update(
            e
            for e in artifacts.glob(depth)
            if e.name.startswith("checkpoint-") and e.is_dir() and not e.is_symlink()
        )
    return found


def _entries(folder: Path) -> list[Path]:
    try:
        return [e for e in folder.iterdir() if not e.is_symlink()]
    except OSError:
        return []


def checkpoints(artifacts: Path, attempt_id: str = "") -> list[Checkpoint]:
    """The checkpoints under an attempt's artifacts folder, oldest first; never one being
    written (a dot name, `.tmp` or `.partial`)."""
    found = []
    for path in _candidates(artifacts):
        name = path.name
        if name.startswith(".") or name.endswith((".tmp", ".partial")):
            continue
        step = _STEP.search(name)
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue
        relpath = path.relative_to(artifacts).as_posix()
        found.append(Checkpoint(int(step.group(1)) if step else -1, mtime, relpath, attempt_id))
    return sorted(found)


def surplus(
    found: list[Checkpoint],
    keep: int,
    protected: set[tuple[str, str]],
    running: set[str],
    now: float | None = None,
) -> list[Checkpoint]:
    """What a rule of `keep` removes of a run's checkpoints (`found`, across its attempts):
    all but the newest `keep`, less the `protected` ((attempt id, relpath): what a retry
    resumes from) and, of the `running` attempts, any changed within SETTLE_S."""
    at = time.time() if now is None else now
    ranked = sorted(found, key=lambda c: (c.step, c.mtime), reverse=True)
    return [
        c
        for c in ranked[keep:]
        if (c.attempt_id, c.relpath) not in protected
        and not (c.attempt_id in running and at - c.mtime < SETTLE_S)
    ]


def resume_point(artifacts: Path) -> str | None:
    """The checkpoint a retry after this attempt would resume from (newest_checkpoint's choice)."""
    return newest_checkpoint(str(artifacts))
