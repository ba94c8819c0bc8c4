"""What of an attempt's files the agent sends next: pure planning over the attempt's folder and
what the server is known to have. Logs and small files go first, large ones (checkpoints) last,
or only when `orbit collect` asks; each file goes by byte offset, and a file that will not change
any more (its attempt ended) is sealed with its size and sha256, which the server checks."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from orbit.core.execution.mirror import is_scratch
from orbit.runtime import host_files
from orbit.wire.protocol import FILE_PATH, MAX_CHUNK_BYTES, FileChunk

log = logging.getLogger("orbit.agent")
MAX_MANIFEST_BYTES = 64 << 20  # the most of a manifest read to see that its files are all here
LARGE_BYTES = 64 << 20  # a file this large waits behind the others (or for collect)
FIRST = ("runtime/",)
NEXT_SUFFIXES = (".log", "manifest.json", "nvml-audit.jsonl", "nvml-minutes.jsonl", "logging.jsonl")


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


# a JSON file the wrapper is writing (runtime.records.write_json: name.tmp-PID, then renamed):
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
    """The plain files under the attempt's runtime/ and artifacts/, never through a link: a
    task (or a container's root) may put links there, to the agent's credential say, that
    an agent reading as root must not follow (os.fwalk checks each folder it enters is the
    one it listed)."""
    found = []
    for part in ("runtime", "artifacts"):
        if not os.path.isdir(folder / part):
            continue  # not made yet (a copy under way), or gone
        for dirpath, _dirs, names, dirfd in os.fwalk(folder / part, follow_symlinks=False):
            for name in names:
                path = Path(dirpath) / name
                if is_scratch(path) or WRAPPER_TMP.search(name):
                    continue
                try:
                    st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    found.append((path.relative_to(folder).as_posix(), st))
    return found


def _parent_beneath(folder: Path, parts: list[str]) -> int:
    """The folder holding `parts[-1]` under `folder`, opened one path component at a time
    without following a link: a folder swapped for a link after it was listed leads
    nowhere."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_beneath(folder: Path, relpath: str) -> int:
    """A read-only descriptor of the plain file `relpath` under `folder`, never through a
    link (_parent_beneath). OSError when there is no such plain file."""
    parts = relpath.split("/")
    fd = _parent_beneath(folder, parts)
    try:
        found = os.open(parts[-1], host_files.READ_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(found).st_mode):
        os.close(found)
        raise FileNotFoundError(f"not a plain file: {relpath}")
    return found


def copy_beneath(folder: Path, relpath: str, dest: Path) -> None:
    """Copy `relpath` under `folder` (a plain file, or a folder of them) to `dest`, never
    through a link: what a task left there may point anywhere (the node's credential, another
    tenant's attempt), and the agent copies as root. Links, fifos and devices are left out."""
    parts = relpath.split("/")
    fd = _parent_beneath(folder, parts)
    try:
        st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode):
            _copy_fd(os.open(parts[-1], host_files.READ_FLAGS, dir_fd=fd), dest)
        elif stat.S_ISDIR(st.st_mode):
            top = os.open(parts[-1], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            try:
                _copy_tree_fd(top, dest)
            finally:
                os.close(top)
        else:
            raise FileNotFoundError(f"{relpath}: not a file or a folder")
    finally:
        os.close(fd)


def _copy_tree_fd(top: int, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for dirpath, _dirs, names, dirfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
        here = dest / dirpath
        here.mkdir(parents=True, exist_ok=True)
        for name in names:
            if stat.S_ISREG(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode):
                _copy_fd(os.open(name, host_files.READ_FLAGS, dir_fd=dirfd), here / name)


def _copy_fd(source: int, dest: Path) -> None:
    """Copy an open plain file (closed after) to a new file at `dest`."""
    with os.fdopen(source, "rb") as f, open(dest, "xb") as out:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise FileNotFoundError(f"{dest.name}: not a plain file")
        for block in iter(lambda: f.read(1 << 20), b""):
            out.write(block)


def sha256_beneath(folder: Path, relpath: str) -> str:
    with os.fdopen(open_beneath(folder, relpath), "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


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
            data = _read(folder, relpath, 0, size)
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
            first = _read(folder, relpath, 0, min(size, MAX_CHUNK_BYTES))
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
                        path=relpath, offset=size, size=size, sha256=sha256_beneath(folder, relpath)
                    )
                )
            continue
        room = budget - used
        if room <= 0:
            complete = False
            continue
        want = min(size - state.offset, MAX_CHUNK_BYTES, room)
        data = _read(folder, relpath, state.offset, want)
        last = state.offset + len(data) >= size
        seal = {"size": size, "sha256": sha256_beneath(folder, relpath)} if ended and last else {}
        chunks.append(
            FileChunk(
                path=relpath, offset=state.offset, data=base64.b64encode(data).decode(), **seal
            )
        )
        used += len(data)
        if not last:
            complete = False
    if complete and ended:  # a folder wiped while it was listed is not complete, but gone
        complete = _manifest_here(folder, {relpath for relpath, _st in entries})
    return chunks, complete and ended, used


def _manifest_here(folder: Path, listed: set[str]) -> bool:
    """Whether every file the wrapper's manifest names was in this listing (True without a
    manifest: a wrapper that died wrote none)."""
    if "artifacts/manifest.json" not in listed:
        return True
    try:
        with os.fdopen(open_beneath(folder, "artifacts/manifest.json"), "rb") as f:
            text = f.read(MAX_MANIFEST_BYTES)
    except OSError:  # listed, and gone since: the folder is going
        return False
    try:
        named = [str(f["path"]) for f in json.loads(text)["files"]]
    except (ValueError, KeyError, TypeError):  # not the wrapper's (a task's, say): no word
        return True
    artifacts = folder / "artifacts"
    return all(
        f"artifacts/{p}" in listed or is_scratch(artifacts / p) or WRAPPER_TMP.search(p)
        for p in named
    )


def _read(folder: Path, relpath: str, offset: int, count: int) -> bytes:
    try:
        with os.fdopen(open_beneath(folder, relpath), "rb") as f:
            f.seek(offset)
            return f.read(count)
    except OSError:
        return b""
