"""Collect over HTTP, incremental and resumable. The client says what it already has at its
destination (each file's path, size and sha256; and how far each file a cut transfer left
half-written got), the server compares that with its one copy of the attempt's artifacts and
sends, as a PAX tar stream, only the files that differ; a file the client has the start of
goes on from there (the member then holds the rest of it, its offset in the `ORBIT.offset`
header). Each member whose sha256 the server knows carries it (`ORBIT.sha256`), with the
file's whole size (`ORBIT.size`), so that the client checks what it put together.

A file's sha256 on the server is the manifest's (the wrapper's, or the agent's, checked when
its upload completed) when the manifest lists it with that size, else taken now: an unchanged
attempt costs the server a stat per file and moves nothing."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field

from orbit.core.execution.artifacts import STATE_DIR, sha256_file
from orbit.core.execution.mirror import is_scratch
from orbit.model.models import Record
from orbit.model.records import CollectResult

OFFSET, SHA256, SIZE = "ORBIT.offset", "ORBIT.sha256", "ORBIT.size"
BLOCK = 1 << 20
__all__ = [
    "STATE_DIR",
    "Have",
    "Held",
    "Item",
    "Listing",
    "Partial",
    "listing",
    "tar_stream",
    "to_send",
]


class Have(Record):
    """A file the client has at its destination."""

    path: str = Field(min_length=1, max_length=4096)
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Partial(Record):
    """A file a cut transfer left half-written at the client: its first `offset` bytes."""

    path: str = Field(min_length=1, max_length=4096)
    offset: int = Field(ge=0)


@dataclass
class Held:
    """The control plane's one copy of an attempt's artifacts, ready to serve: each root is
    (where under the destination, the folder), rank 0 first; what kept it from being whole;
    and what retention or gc removed of it (prefixes under the destination, and why)."""

    roots: list[tuple[str, Path]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    removed: dict[str, str] = field(default_factory=dict)

    def note(self, source: Path, dest: Path, skip: object = None) -> CollectResult:
        """A backend's collect `copy` that copies nothing: it notes where the files are
        (`dest`: where under the destination, `.` for the top)."""
        self.roots.append(("" if dest == Path(".") else dest.as_posix(), source))
        return CollectResult(dest=dest, verified=True)


@dataclass(frozen=True)
class Item:
    """A file to send: where it goes, where it is, its size, from where, its sha256."""

    path: str
    source: Path
    size: int
    offset: int = 0
    sha256: str | None = None


@dataclass
class Listing:
    """The served copy's files (destination path -> (source, size)) and their known digests."""

    files: dict[str, tuple[Path, int]] = field(default_factory=dict)
    digests: dict[str, tuple[int, str]] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(size for _, size in self.files.values())


def listing(held: Held) -> Listing:
    """Every file of the copy (no links, no upload under way); a gang's rank 0 leaves out its
    own nodes/ folder, where the other ranks' files go."""
    found = Listing()
    gang = len(held.roots) > 1
    for prefix, root in held.roots:
        lead = f"{prefix}/" if prefix else ""
        found.digests.update({lead + k: v for k, v in _manifest(root).items()})
        for path in sorted(root.rglob("*")) if root.is_dir() else ():
            rel = path.relative_to(root).as_posix()
            if path.is_symlink() or not path.is_file() or is_scratch(path):
                continue
            if gang and not prefix and rel.startswith("nodes/"):
                continue
            found.files[lead + rel] = (path, path.stat().st_size)
    return found


def _manifest(root: Path) -> dict[str, tuple[int, str]]:
    try:
        entries = json.loads((root / "manifest.json").read_text(encoding="utf-8"))["files"]
        return {str(e["path"]): (int(e["size"]), str(e["sha256"])) for e in entries}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def to_send(found: Listing, have: Iterable[Have], partial: Iterable[Partial]) -> list[Item]:
    """What differs from what the client has; what it has the start of goes on from there."""
    theirs = {h.path: h for h in have}
    begun = {p.path: p.offset for p in partial}
    items = []
    for path, (source, size) in found.files.items():
        known = found.digests.get(path)
        digest = known[1] if known is not None and known[0] == size else None
        mine = theirs.get(path)
        if mine is not None and mine.size == size:
            digest = digest or sha256_file(source)
            if digest == mine.sha256:
                continue  # unchanged: nothing moves
            items.append(Item(path, source, size, 0, digest))
        elif 0 < begun.get(path, 0) < size:
            # the client puts the rest after what it has: it checks the whole against this
            items.append(Item(path, source, size, begun[path], digest or sha256_file(source)))
        else:
            items.append(Item(path, source, size, 0, digest))
    return items


def tar_stream(items: Iterable[Item]) -> Iterator[bytes]:
    """A PAX tar of `items`, a block at a time (never a whole file in memory). A file that
    shrank since it was listed is padded with zeros: its digest then tells the client."""
    for item in items:
        info = tarfile.TarInfo(item.path)
        info.size = item.size - item.offset
        # the caller's to share, as an embedded collect's copy is (the server keeps its own
        # copy 0600): 0644, and 0755 for a program
        info.mode = 0o755 if _executable(item.source) else 0o644
        headers = {SIZE: str(item.size)}
        if item.offset:
            headers[OFFSET] = str(item.offset)
        if item.sha256:
            headers[SHA256] = item.sha256
        info.pax_headers = headers
        yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        yield from _content(item.source, item.offset, info.size)
        pad = -info.size % tarfile.BLOCKSIZE
        if pad:
            yield b"\0" * pad
    yield b"\0" * (tarfile.BLOCKSIZE * 2)


def _executable(source: Path) -> bool:
    try:
        return bool(source.stat().st_mode & 0o100)
    except OSError:
        return False


def _content(source: Path, offset: int, count: int) -> Iterator[bytes]:
    left = count
    try:
        with open(source, "rb") as f:
            f.seek(offset)
            while left > 0:
                block = f.read(min(BLOCK, left))
                if not block:
                    break
                left -= len(block)
                yield block
    except OSError:
        pass  # gone meanwhile (removed by gc): zeros, which the client's check catches
    while left > 0:
        step = min(BLOCK, left)
        left -= step
        yield b"\0" * step
