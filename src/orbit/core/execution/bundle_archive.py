"""The bundle's archive, the form it travels in to an agent's node: a tar of the frozen parts
only, the same bytes for the same bundle, and its extraction, every member checked before
anything is written (nothing outside the bundle, no special files) and nothing left behind by
an unsafe archive or one that does not give its digest."""

from __future__ import annotations

import os
import shutil
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from orbit.core.execution.bundle import FROZEN_PARTS, LIVE_PARTS, compute_digest, frozen_entries
from orbit.model.errors import InvalidInput
from orbit.model.tarsafe import extract_member


def create_bundle_archive(bundle_dir: Path, dest: Path) -> Path:
    """A tar of the frozen parts only: no runtime/ or artifacts/ ride along on a retry.

    Entries are sorted, with zero mtimes and owners, so the same bundle gives the same bytes.
    """
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        for e in frozen_entries(bundle_dir):
            info = tarfile.TarInfo(e.relpath)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if e.kind == "d":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif e.kind == "l":
                info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, e.link_target
                tar.addfile(info)
            else:
                path = bundle_dir / e.relpath
                info.size, info.mode = path.stat().st_size, 0o755 if e.executable else 0o644
                with open(path, "rb") as f:
                    tar.addfile(info, f)
    return dest


class UnsafeArchive(InvalidInput):
    """An archive member that would write outside the bundle or create a special file."""


def _check_member(member: tarfile.TarInfo, names: set[str], links: set[str]) -> None:
    name = member.name
    parts = PurePosixPath(name).parts
    for n in range(1, len(parts)):
        if "/".join(parts[:n]) in links:
            raise UnsafeArchive(f"archive member '{name}': its path passes through a link")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchive(f"archive member '{name}': absolute paths are refused")
    if ".." in parts:
        raise UnsafeArchive(f"archive member '{name}': '..' in a path is refused")
    if parts and parts[0] not in FROZEN_PARTS:
        raise UnsafeArchive(
            f"archive member '{name}': a bundle archive holds only {', '.join(FROZEN_PARTS)}"
        )
    if member.issym():
        target = member.linkname
        joined = os.path.normpath(os.path.join(os.path.dirname(name), target))
        if os.path.isabs(target) or joined == ".." or joined.startswith("../"):
            raise UnsafeArchive(f"archive member '{name}': link to '{target}' leaves the bundle")
    elif member.islnk():
        if member.linkname not in names:
            raise UnsafeArchive(
                f"archive member '{name}': hard link to '{member.linkname}' outside the bundle"
            )
    elif not (member.isreg() or member.isdir()):
        raise UnsafeArchive(f"archive member '{name}': special files are refused")


def iter_checked_members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    names: set[str] = set()
    links: set[str] = set()
    members = tar.getmembers()
    for member in members:
        _check_member(member, names, links)
        names.add(member.name)
        if member.issym():
            links.add(member.name.rstrip("/"))
    yield from members


def extract_bundle_archive(archive: Path, dest: Path, expected_digest: str | None = None) -> Path:
    """Extract into `dest` (which must not exist). Every member is checked before anything is
    written; an unsafe archive, or one whose digest is not `expected_digest`, leaves nothing
    behind."""
    if dest.exists():
        raise InvalidInput(f"{dest}: already exists; extraction needs a fresh folder")
    scratch = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex}")
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = list(iter_checked_members(tar))
            scratch.mkdir(parents=True)
            for member in members:
                extract_member(tar, member, scratch)
        if expected_digest is not None and compute_digest(scratch) != expected_digest:
            raise InvalidInput(f"{archive}: content does not match bundle {expected_digest[:12]}")
        for part in LIVE_PARTS:
            (scratch / part).mkdir(exist_ok=True)
        scratch.rename(dest)
    except tarfile.TarError as exc:
        shutil.rmtree(scratch, ignore_errors=True)
        raise InvalidInput(f"{archive}: not a readable bundle archive: {exc}") from None
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return dest
