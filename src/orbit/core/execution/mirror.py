"""The control plane's copy of an agent_pool attempt's files: `<artifacts>/<attempt id>/` holds
runtime/ and artifacts/ as the attempt's own bundle on its node does, written from the agent's
reports. Reading a pool run (status, logs, progress, collect) reads this folder, as reading a
local run reads the attempt's own; `agent.json` beside them holds what only the control plane
knows (the agent's word on the wrapper, a refusal, a loss).

Writes are by byte offset: bytes the copy already has are skipped (a resend changes nothing),
bytes past its end are refused with the offset to send from (a gap is asked for again), and a
file that comes with its sha256 is checked whole when complete."""

from __future__ import annotations

import json
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from orbit.core.execution.artifacts import sha256_file

AGENT_FILE = "agent.json"


class BadChunk(ValueError):
    """A chunk that cannot be applied: a path outside the attempt, a sha256 that does not match."""


@dataclass(frozen=True)
class Applied:
    """What applying a chunk came to: the copy's size after it, and the offset the server wants
    next when that is not where the agent's next chunk would start (None: all is well)."""

    size: int
    want: int | None = None


def attempt_dir(root: Path, attempt_id: str) -> Path:
    return root / attempt_id


def scratch_name(name: str) -> str:
    """The name a whole-file write goes to before it replaces `name`."""
    return f".{name}.part"


def is_scratch(path: Path) -> bool:
    """A write under way in the copy (see scratch_name): never an artifact of its own."""
    return path.name.startswith(".") and path.name.endswith(".part")


def safe_path(folder: Path, relpath: str) -> Path:
    """`relpath` under `folder`, refusing absolute paths, `..` and links that lead out."""
    parts = PurePosixPath(relpath).parts
    if (
        not parts
        or relpath.startswith("/")
        or ".." in parts
        or parts[0]
        not in (
            "runtime",
            "artifacts",
        )
    ):
        raise BadChunk(f"'{relpath}': expected a path under runtime/ or artifacts/")
    target = folder.joinpath(*parts)
    here = folder.resolve()
    if not str(target.parent.resolve()).startswith(str(here)):
        raise BadChunk(f"'{relpath}': leads outside the attempt's folder")
    if target.is_symlink():
        raise BadChunk(f"'{relpath}': is a link")
    return target


def apply_chunk(
    folder: Path,
    relpath: str,
    offset: int,
    data: bytes,
    *,
    replace: bool = False,
    size: int | None = None,
    sha256: str | None = None,
) -> Applied:
    """Write one chunk into the copy (see the module's docstring)."""
    target = safe_path(folder, relpath)
    _make_room(folder, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if replace:
        tmp = target.with_name(scratch_name(target.name))
        tmp.write_bytes(data)
        os.replace(tmp, target)
        return Applied(len(data))
    if not target.exists():
        target.touch()
    have = target.stat().st_size
    if offset > have:
        return Applied(have, want=have)
    new = data[have - offset :] if offset < have else data
    if new:
        with open(target, "ab") as out:
            out.write(new)
        have += len(new)
    complete = sha256 is not None and size is not None and have >= size
    if complete and (have > (size or 0) or sha256_file(target) != sha256):
        target.unlink()  # the copy is wrong: start it again
        return Applied(0, want=0)
    return Applied(have)


def _make_room(folder: Path, target: Path) -> None:
    """The node's layout wins: a file where the chunk needs a folder (the task replaced a file
    by a folder of that name), or a folder where it needs a file, is the copy's stale past."""
    here = folder
    for part in target.relative_to(folder).parts[:-1]:
        here = here / part
        if here.is_file():
            here.unlink()
    if target.is_dir():
        shutil.rmtree(target)


def read_agent_state(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / AGENT_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_agent_state(folder: Path, **changes: Any) -> dict[str, Any]:
    """Merge `changes` into agent.json (atomically: a reader sees the old or the new). One
    merge at a time in this process: a claim's `started` and a report's `alive` merged at once
    could each write over the other's (an attempt then looked never started, for good)."""
    with _AGENT_STATE_LOCK:
        folder.mkdir(parents=True, exist_ok=True)
        state = {**read_agent_state(folder), **changes}
        tmp = folder / f".{AGENT_FILE}.{os.getpid()}.{threading.get_ident()}.part"
        tmp.write_text(json.dumps(state, sort_keys=True))
        os.replace(tmp, folder / AGENT_FILE)
        return state


_AGENT_STATE_LOCK = threading.Lock()
