"""What of an attempt's files the agent sends next: pure planning over the attempt's folder and
what the server is known to have. Logs and small files go first, large ones (checkpoints) last,
or only when `orbit collect` asks; each file goes by byte offset, and a file that will not change
any more (its attempt ended) is sealed with its size and sha256, which the server checks."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from orbit.agent.protocol import FILE_PATH, MAX_CHUNK_BYTES, FileChunk
from orbit.core.execution.artifacts import sha256_file
from orbit.core.execution.mirror import is_scratch

log = logging.getLogger("orbit.agent")
LARGE_BYTES = 64 << 20  # a file this large waits behind the others (or for collect)
FIRST = ("runtime/",)
NEXT_SUFFIXES = (".log", "manifest.json", "nvml-audit.jsonl", "logging.jsonl")


@dataclass
class FileState:
    """What the server is known to have of one file."""

    offset: int = 0  # bytes it has (append-type files)
    sig: tuple[int, int] | None = None  # (size, mtime_ns) of the copy it has (whole files)
    sealed: bool = False  # its size and sha256 were accepted
    planned_sig: tuple[int, int] | None = None
    unsendable: bool = False  # its name cannot travel (`unsendable`): left on the node

    def sent(self, chunk: FileChunk) -> None:
        data = len(base64.b64decode(chunk.data)) if chunk.data else 0
        if chunk.replace:
            self.offset, self.sig = data, self.planned_sig
        else:
            self.offset = max(self.offset, chunk.offset + data)
        if chunk.sha256 is not None:
            self.sealed = True


# a JSON file the wrapper is writing (runtime.wrapper.write_json: name.tmp-PID, then renamed):
# sent, it would stay in the control plane's copy after the rename, an artifact of nobody's
WRAPPER_TMP = re.compile(r"\.json\.tmp-\d+$")


def unsendable(relpath: str) -> str | None:
    """Why a file's name cannot travel in a report (the protocol's paths are UTF-8, at most
    1,000 characters), or None. Such a file stays on the node, said once in the agent's log,
    instead of having every report of the node refused."""
    try:
        relpath.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not UTF-8"
    if not re.match(FILE_PATH, relpath):
        return "its path is over 1,000 characters"
    return None


def whole_file(relpath: str, size: int) -> bool:
    """Files the runtime rewrites (status.json): sent whole each time they change."""
    return relpath.endswith(".json") and size <= MAX_CHUNK_BYTES


def priority(relpath: str, size: int) -> int:
    if relpath.startswith(FIRST):
        return 0
    if relpath.endswith(NEXT_SUFFIXES) or relpath.startswith("artifacts/previews/"):
        return 1
    if size >= LARGE_BYTES or relpath.startswith("artifacts/checkpoints/"):
        return 3
    return 2


def listing(folder: Path) -> list[tuple[str, os.stat_result]]:
    found = []
    for part in ("runtime", "artifacts"):
        root = folder / part
        for dirpath, _dirs, names in os.walk(root):
            for name in names:
                path = Path(dirpath) / name
                if is_scratch(path) or WRAPPER_TMP.search(name):
                    continue
                try:
                    st = path.lstat()
                except OSError:
                    continue
                if not path.is_file() or path.is_symlink():
                    continue
                found.append((path.relative_to(folder).as_posix(), st))
    return found


def plan_chunks(
    folder: Path, files: dict[str, FileState], budget: int, *, ended: bool, large: bool
) -> tuple[list[FileChunk], bool, int]:
    """The chunks to send now (at most `budget` bytes), whether everything is then sent and
    sealed (only once the attempt ended), and the bytes used."""
    chunks: list[FileChunk] = []
    used = 0
    complete = ended
    entries = sorted(listing(folder), key=lambda e: (priority(e[0], e[1].st_size), e[0]))
    for relpath, st in entries:
        state = files.get(relpath)
        if state is None:
            state = files[relpath] = FileState()
            why = unsendable(relpath)
            if why is not None:
                state.unsendable = True
                log.warning("%s: not uploaded, %s", folder / relpath, why)
        if state.unsendable:
            continue
        size = st.st_size
        if priority(relpath, size) == 3 and not large:
            complete = False  # waits for `orbit collect`
            continue
        if whole_file(relpath, size):
            sig = (size, st.st_mtime_ns)
            if state.sig == sig and (state.sealed or not ended):
                continue
            if used + size > budget and chunks:
                complete = False
                continue
            data = _read(folder / relpath, 0, size)
            state.planned_sig = sig
            sealed = (
                {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} if ended else {}
            )
            chunks.append(
                FileChunk(
                    path=relpath,
                    offset=0,
                    data=base64.b64encode(data).decode(),
                    replace=True,
                    **sealed,
                )
            )
            used += len(data)
            continue
        if size < state.offset:  # rewritten shorter: start it again
            state.offset, state.sealed = 0, False
            first = _read(folder / relpath, 0, min(size, MAX_CHUNK_BYTES))
            state.planned_sig = None
            chunks.append(
                FileChunk(
                    path=relpath, offset=0, data=base64.b64encode(first).decode(), replace=True
                )
            )
            used += len(first)
            complete = False
            continue
        if size == state.offset:
            if ended and not state.sealed:
                chunks.append(
                    FileChunk(
                        path=relpath, offset=size, size=size, sha256=sha256_file(folder / relpath)
                    )
                )
            continue
        room = budget - used
        if room <= 0:
            complete = False
            continue
        want = min(size - state.offset, MAX_CHUNK_BYTES, room)
        data = _read(folder / relpath, state.offset, want)
        last = state.offset + len(data) >= size
        seal = {"size": size, "sha256": sha256_file(folder / relpath)} if ended and last else {}
        chunks.append(
            FileChunk(
                path=relpath, offset=state.offset, data=base64.b64encode(data).decode(), **seal
            )
        )
        used += len(data)
        if not last:
            complete = False
    return chunks, complete and ended, used


def _read(path: Path, offset: int, count: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(count)
    except OSError:
        return b""
