"""Unpacking a tar archive that came over the network (a client's gathered inputs, a server's
collected artifacts) without letting it write outside its folder.

tarfile's `data` filter refuses absolute paths, `..`, device files and links that lead out,
but Python releases before 3.11.13 / 3.12.11 can be led around it by a chain of symlinks
(CVE-2025-4517). So before the filter runs: no member may be an absolute path or climb with
`..`, no symlink may point to an absolute path or climb out of the archive, no member may be
reached through a symlink of the archive, and a hard link may only name a file that came
before it."""

from __future__ import annotations

import posixpath
import tarfile
from pathlib import Path

from orbit.model.errors import InvalidInput


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


def extract_all(tar: tarfile.TarFile, dest: Path, what: str) -> None:
    """Check every member (see check_member), then extract with the `data` filter."""
    members = tar.getmembers()
    links: set[str] = set()
    files: set[str] = set()
    for member in members:
        check_member(member, links, files, what)
    for member in members:
        try:
            tar.extract(member, dest, filter="data")
        except tarfile.FilterError as exc:
            raise InvalidInput(f"{what}: {member.name}: {exc}") from None
