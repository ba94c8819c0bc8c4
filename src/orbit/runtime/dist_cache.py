"""The precheck's list of installed distributions, kept between runs per folder of sys.path.

Travels inside the bundle beside the precheck (scripts/orbit_dist_cache.py); standard library
only, Python >= 3.8. Listing what an interpreter has installed means importing
importlib.metadata (~45 ms) and reading every distribution's metadata, on every run; what it
lists changes only when a package is installed, upgraded or removed. So each folder on
sys.path gets a fingerprint that any of those changes: the name, inode, size and change times
of each *.dist-info / *.egg-info entry in it, and of the metadata file and direct_url.json in
it (pip writes a new dist-info folder, named with the version, for every install and upgrade,
and removes it on uninstall; ctime cannot be set back by any tool). A folder whose
fingerprint matches its cached one is listed from the cache; any other is read afresh and
cached again. What the precheck writes is the same either way.

The cache is the user's own: $ORBIT_PRECHECK_CACHE (`off` for none), or
$XDG_CACHE_HOME/orbit/precheck (~/.cache/orbit/precheck). A file there is read only when the
folder and the file are this user's and no one else may write them, so nobody else can make a
run's record lie (an agent running as root gives each attempt a user and home of its own: there
every run lists afresh). A folder that is not a plain absolute directory (a zip, an egg, the
current directory), or an interpreter with another finder of distributions on sys.meta_path,
is always listed afresh.
"""

from __future__ import annotations

import json
import os
import sys
import zlib

TYPE_CHECKING = False  # typing costs ~5 ms of the precheck's start
if TYPE_CHECKING:  # as mypy reads them
    from collections.abc import Callable
    from typing import Any

    # one folder's listing, in the order importlib.metadata finds its distributions: a
    # ["dist", normalized name, pip freeze line] or a ["unreadable", the line saying why]
    Items = list[list[str]]

SUFFIXES = (".dist-info", ".egg-info")
META_FILES = ("METADATA", "PKG-INFO", "direct_url.json")
SCHEMA = 1


def where() -> str | None:
    value = os.environ.get("ORBIT_PRECHECK_CACHE")
    if value is not None:
        return None if value.strip() in ("", "off") else value
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "orbit", "precheck")


def only_path_finder() -> bool:
    """Whether importlib.metadata finds distributions only in sys.path's folders (the path
    finder): another finder could list what no folder's fingerprint covers."""
    import importlib.machinery

    return all(
        finder is importlib.machinery.PathFinder
        for finder in sys.meta_path
        if getattr(finder, "find_distributions", None) is not None
    )


def _stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def fingerprint(folder: str) -> list[Any] | None:
    """What any install, upgrade or removal in `folder` changes; [] for a folder that holds
    no distribution or does not exist; None where the folder cannot be fingerprinted."""
    if not os.path.isabs(folder) or folder.endswith(".egg"):
        return None
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    except OSError:  # a zip file, or unreadable: importlib.metadata has its own ways there
        return None
    found: list[Any] = []
    for name in names:
        if name.lower().endswith(SUFFIXES):
            path = os.path.join(folder, name)
            found.append([name, _stat(path)] + [_stat(os.path.join(path, f)) for f in META_FILES])
    return found


def _private(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _file(cache: str, folder: str) -> str:
    crc = zlib.crc32(folder.encode("utf-8", "surrogateescape"))
    return os.path.join(cache, f"{crc:08x}.json")


def load(cache: str, folder: str, mark: list[Any]) -> Items | None:
    try:
        if not _private(os.stat(cache)):
            return None
        fd = os.open(_file(cache, folder), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        with os.fdopen(fd, encoding="utf-8") as f:
            if not _private(os.fstat(f.fileno())):
                return None
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return None
    if data.get("folder") != folder or data.get("fingerprint") != mark:
        return None
    items = data.get("items")
    return items if isinstance(items, list) else None


def save(cache: str, folder: str, mark: list[Any], items: Items) -> None:
    """Written whole or not at all (a temporary file renamed); a cache that cannot be written
    is no cache, never a failed precheck."""
    try:
        os.makedirs(cache, mode=0o700, exist_ok=True)
        if not _private(os.stat(cache)):
            return
        tmp = _file(cache, folder) + f".tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"schema": SCHEMA, "folder": folder, "fingerprint": mark, "items": items}, f)
        os.replace(tmp, _file(cache, folder))
    except OSError:
        pass


def listing(read: Callable[[str], Items], path: list[str] | None = None) -> tuple[Items, str]:
    """Every folder of `path` (sys.path) listed by `read` or from the cache, in order; and how
    many came from the cache, in words."""
    cache = where() if only_path_finder() else None
    items: Items = []
    kept = total = 0
    for folder in sys.path if path is None else path:
        mark = fingerprint(folder) if cache else None
        if mark == []:  # nothing is installed there
            continue
        total += 1
        found = load(cache, folder, mark) if cache and mark is not None else None
        if found is None:
            found = read(folder)
            if cache and mark is not None:
                save(cache, folder, mark, found)
        else:
            kept += 1
        items.extend(found)
    if not cache:
        return items, "off"
    return items, f"{kept} of {total} folders from the cache"
