"""Unpacking a tar archive that came over the network (a client's gathered inputs, a server's
collected artifacts) without letting it write outside its folder.

tarfile's `data` filter refuses absolute paths, `..`, device files and links that lead out,
but Python releases before 3.11.13 / 3.12.11 can be led around it by a chain of symlinks
(CVE-2025-4517). So before the filter runs: no member may be an absolute path or climb with
`..`, no symlink may point to an absolute path or climb out of the archive, no member may be
reached through a symlink of the archive, and a hard link may only name a file that came
before it.

The `data` filter arrived in Python 3.11.4 (and 3.8.17, 3.9.17, 3.10.12); Debian 12's own
python3 is 3.11.2. There, the checks above already refuse everything the filter would, and
extract_member does the rest of what the filter does: ownership is the extracting user's,
and no set-uid, set-gid or sticky bit, nor write for group or others, is written."""

from __future__ import annotations

import copy
import os
import posixpath
import stat
import tarfile
from pathlib import Path

from orbit.model.errors import InvalidInput

HAS_FILTERS = hasattr(tarfile, "data_filter")
# what the filter raises where it exists; nothing to catch where it does not
FILTER_ERRORS: tuple[type[Exception], ...] = (
    (tarfile.FilterError,) if HAS_FILTERS else ()  # type: ignore[attr-defined,unused-ignore]
)


def check_member(member: tarfile.TarInfo, links: set[str], files: set[str], what: str) -> None:
    """Refuse `member` (naming it, and `what` the archive holds) unless it stays inside;
    `links` and `files` are the symlinks and files seen so far, and are updated."""
    name = member.name
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise InvalidInput(f"{what}: {name}: an absolute path")
    clean = posixpath.normpath(name)
    if clean == ".." or clean.startswith("../"):
        raise InvalidInput(f"{what}: {name}: a path outside the {what}")
    parts = clean.split("/")
    for depth in range(1, len(parts)):
        if "/".join(parts[:depth]) in links:
            raise InvalidInput(f"{what}: {name}: reached through a symbolic link")
    if member.issym():
        target = member.linkname
        if target.startswith("/"):
            raise InvalidInput(f"{what}: {name}: a link to an absolute path")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(clean), target))
        if resolved == ".." or resolved.startswith("../"):
            raise InvalidInput(f"{what}: {name}: a link that leads outside the {what}")
        links.add(clean)
    elif member.islnk():
        target = posixpath.normpath(member.linkname)
        if member.linkname.startswith("/") or target == ".." or target.startswith("../"):
            raise InvalidInput(f"{what}: {name}: a link that leads outside the {what}")
        if target not in files:
            raise InvalidInput(f"{what}: {name}: a hard link to a file not in the archive")
        files.add(clean)
    elif member.isfile():
        files.add(clean)
    elif not member.isdir():
        raise InvalidInput(f"{what}: {name}: not a file, folder or link")


def as_data(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """`member` as the `data` filter would write it (for a Python without the filter): owned
    by whoever extracts it, no special mode bits, nothing writable by group or others, a file
    readable and writable by its owner. Only for a member check_member has passed."""
    safe = copy.copy(member)
    safe.uid, safe.gid = os.getuid(), os.getgid()
    safe.uname = safe.gname = ""  # no lookup by name: the numbers above are used
    mode = member.mode & ~(stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWGRP | stat.S_IWOTH)
    if member.isreg() or member.islnk():
        mode |= stat.S_IRUSR | stat.S_IWUSR
    elif member.isdir():
        mode |= stat.S_IRWXU
    safe.mode = mode
    return safe


def extract_member(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path | str) -> None:
    """Extract one member that check_member has passed: with the `data` filter where Python
    has it, else written as that filter would (as_data)."""
    if HAS_FILTERS:
        tar.extract(member, dest, filter="data")
    else:
        tar.extract(as_data(member), dest)


def extract_all(tar: tarfile.TarFile, dest: Path, what: str) -> None:
    """Check every member (see check_member), then extract each as the `data` filter would."""
    members = tar.getmembers()
    links: set[str] = set()
    files: set[str] = set()
    for member in members:
        check_member(member, links, files, what)
    for member in members:
        try:
            extract_member(tar, member, dest)
        except FILTER_ERRORS as exc:
            raise InvalidInput(f"{what}: {member.name}: {exc}") from None
