"""A collect over HTTP at its destination (the other side: orbit.core.storage.wire). What the
destination has is said by path, size and sha256; the sha256s are kept in
DEST/.orbit-collect/digests.json with each file's size and modification time, so that a file
unchanged since the last collect is not read again. What arrives is written to
DEST/.orbit-collect/partial/ as it comes, checked against the sha256 the server sent, and only
then moved into place: a transfer cut short leaves the files it finished in place and the one
it was writing there, and the next collect goes on from that file's last byte."""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Protocol

from orbit.client.meter import Tick
from orbit.core.execution.artifacts import sha256_file, verify_manifest
from orbit.core.storage.wire import BLOCK, OFFSET, SHA256, SIZE, STATE_DIR, Have, Partial
from orbit.model.records import CollectResult


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


DIGESTS = "digests.json"
PARTIAL = "partial"
WRITE = 64 << 10  # written as it comes in this much at a time: a cut loses less than this


class Destination:
    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self.state = dest / STATE_DIR
        self.partial = self.state / PARTIAL
        self.digests: dict[str, tuple[int, int, str]] = self._load()
        self.moved = 0
        self.problems: list[str] = []

    def _load(self) -> dict[str, tuple[int, int, str]]:
        try:
            data = json.loads((self.state / DIGESTS).read_text(encoding="utf-8"))
            return {str(k): (int(v[0]), int(v[1]), str(v[2])) for k, v in data.items()}
        except (OSError, ValueError, TypeError, IndexError, AttributeError):
            return {}

    def save(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        tmp = self.state / f".{DIGESTS}.part"
        tmp.write_text(json.dumps({k: list(v) for k, v in self.digests.items()}))
        os.replace(tmp, self.state / DIGESTS)

    # --- what is here ------------------------------------------------------------------------

    def have(self) -> tuple[list[Have], list[Partial]]:
        """The destination's files (sha256s known since the last collect reused) and the
        half-written ones a cut transfer left."""
        found: list[Have] = []
        fresh: dict[str, tuple[int, int, str]] = {}
        for rel, path in _files(self.dest, skip=STATE_DIR):
            stat = path.stat()
            known = self.digests.get(rel)
            if known is not None and known[:2] == (stat.st_size, stat.st_mtime_ns):
                digest = known[2]
            else:
                digest = sha256_file(path)
            fresh[rel] = (stat.st_size, stat.st_mtime_ns, digest)
            found.append(Have(path=rel, size=stat.st_size, sha256=digest))
        self.digests = fresh
        partial = [
            Partial(path=rel, offset=path.stat().st_size) for rel, path in _files(self.partial)
        ]
        return found, partial

    # --- what arrives ------------------------------------------------------------------------

    def receive(self, stream: Readable, tick: Tick = lambda moved: None) -> None:
        """Write each member of the tar `stream` (see the module's docstring), telling `tick`
        the bytes moved so far as they are written."""
        with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
            for member in tar:
                source = tar.extractfile(member) if member.isfile() else None
                if source is None or not _safe(member.name):
                    self.problems.append(f"{member.name}: refused (not a file under the folder)")
                    continue
                try:
                    self._write(member, source, tick)
                except OSError as exc:  # this side's disk: said, and the rest goes on
                    self.problems.append(f"{member.name}: {exc.strerror or exc}")

    def _write(self, member: tarfile.TarInfo, source: IO[bytes], tick: Tick) -> None:
        rel = posixpath.normpath(member.name)
        offset = int(member.pax_headers.get(OFFSET, "0"))
        total = int(member.pax_headers.get(SIZE, str(member.size + offset)))
        expected = member.pax_headers.get(SHA256)
        part = self.partial / rel
        part.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        if offset:
            if not part.is_file() or part.stat().st_size < offset:
                self.problems.append(f"{rel}: the server went on from a byte this side lacks")
                return
            with open(part, "rb") as f:
                for block in _blocks(f, offset):
                    digest.update(block)
        with open(part, "r+b" if offset else "wb") as out:
            out.seek(offset)
            out.truncate()
            while block := source.read(WRITE):
                out.write(block)
                digest.update(block)
                self.moved += len(block)
                tick(self.moved)
        self._place(rel, part, total, expected, digest.hexdigest())

    def _place(self, rel: str, part: Path, total: int, expected: str | None, got: str) -> None:
        if part.stat().st_size != total or (expected is not None and got != expected):
            part.unlink()
            self.problems.append(f"{rel}: arrived damaged (not the server's copy); collect again")
            return
        target = self.dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)  # the attempt's layout wins over what was here
        os.replace(part, target)
        stat = target.stat()
        self.digests[rel] = (stat.st_size, stat.st_mtime_ns, got)

    # --- checked --------------------------------------------------------------------------

    def result(self, summary: dict[str, Any]) -> CollectResult:
        """The collect's result: each rank's files checked against its manifest."""
        removed: dict[str, str] = dict(summary.get("removed") or {})
        roots = [str(r) for r in summary.get("roots") or [""]]
        verified, problems = True, list(summary.get("problems") or ())
        for prefix in roots:
            folder = self.dest / prefix if prefix else self.dest
            lead = f"{prefix}/" if prefix else ""
            digests = {
                rel[len(lead) :]: v[2] for rel, v in self.digests.items() if rel.startswith(lead)
            }
            gone = [p[len(lead) :] for p in removed if p.startswith(lead)]
            ignore = ("nodes",) if len(roots) > 1 and not prefix else ()
            found, mine = verify_manifest(folder, digests, ignore=ignore, removed=gone)
            verified = verified and found and not mine
            rank = f"rank {prefix.rsplit('/', 1)[-1]}: " if prefix else ""
            problems += [rank + p for p in mine]
        problems += self.problems
        return CollectResult(
            dest=self.dest,
            files=int(summary.get("files", 0)),
            bytes=int(summary.get("bytes", 0)),
            moved=self.moved,
            verified=verified and not problems,
            problems=tuple(dict.fromkeys(problems)),
            removed=tuple(f"{p}: {why}" for p, why in sorted(removed.items())),
        )


def _files(folder: Path, skip: str | None = None) -> Iterator[tuple[str, Path]]:
    if not folder.is_dir():
        return
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if skip is not None and rel.split("/", 1)[0] == skip:
            continue
        if path.is_file() and not path.is_symlink():
            yield rel, path


def _safe(name: str) -> bool:
    clean = posixpath.normpath(name)
    return not (
        name.startswith("/")
        or clean in ("", ".", "..")
        or clean.startswith("../")
        or clean.split("/", 1)[0] == STATE_DIR
    )


def _blocks(f: IO[bytes], count: int) -> Iterator[bytes]:
    left = count
    while left > 0 and (block := f.read(min(BLOCK, left))):
        left -= len(block)
        yield block
