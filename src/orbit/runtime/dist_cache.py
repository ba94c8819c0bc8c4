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

    # one folder's listing, in the order importlib.metadata finds its distributions:
    # ["dist", normalized name, pip freeze line], ["badline", normalized name, why there is
    # no line] or ["unreadable", why the name cannot be read] (see describe in the precheck)
    Items = list[list[str]]

SUFFIXES = (".dist-info", ".egg-info")
META_FILES = ("METADATA", "PKG-INFO", "direct_url.json")
SCHEMA = 1


def where() -> str | None:
    """The cache's folder; None for none. Only an absolute one: a relative one (or a home that
    cannot be found, where `~` stays `~`) would land in the task's working directory."""
    value = os.environ.get("ORBIT_PRECHECK_CACHE")
    if value is not None:
        found = None if value.strip() in ("", "off") else value
    else:
        base = os.environ.get("XDG_CACHE_HOME", "")
        if not os.path.isabs(base):
            base = os.path.join(os.path.expanduser("~"), ".cache")
        found = os.path.join(base, "orbit", "precheck")
    return found if found is not None and os.path.isabs(found) else None


def code_mark(code: str) -> int | None:
    """What the listing's cached form depends on besides the folder: this file, the file that
    formats each line (`code`), and the interpreter (its discovery rules differ by version);
    None where they cannot be read (no cache then: nothing would tie an entry to its code)."""
    mark = zlib.crc32(sys.version.encode())
    for path in (__file__, code):
        try:
            with open(path, "rb") as f:
                mark = zlib.crc32(f.read(), mark)
        except OSError:
            return None
    return mark


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


def _content(path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            return zlib.crc32(f.read())
    except OSError:
        return None


def fingerprint(folder: str) -> list[Any] | None:
    """What any install, upgrade or removal in `folder` changes; [] for a folder that holds
    no distribution or does not exist; None where the folder is not a plain directory
    importlib.metadata reads as such (a relative one, a zip, an egg in any letter case)."""
    if not os.path.isabs(folder) or folder.rstrip(os.sep).lower().endswith(".egg"):
        return None
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    except OSError:  # a zip file, or unreadable: importlib.metadata has its own ways there
        return None
    found: list[Any] = []
    for name in names:
        low = name.lower()
        if low.endswith(SUFFIXES) or low == "egg-info":
            path = os.path.join(folder, name)
            meta = [_stat(os.path.join(path, f)) for f in META_FILES]
            # where it came from, by content too: a reinstall from another commit may keep
            # every size and, on a coarse clock or a reproducible image, every time
            direct = _content(os.path.join(path, "direct_url.json"))
            found.append([name, _stat(path), meta, direct])
    return found


def _private(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _file(cache: str, folder: str) -> str:
    crc = zlib.crc32(folder.encode("utf-8", "surrogateescape"))
    return os.path.join(cache, f"{crc:08x}.json")


def _items(data: Any) -> Items | None:
    """The cached items, if every one has the shape `listing` gives."""
    if not isinstance(data, list):
        return None
    for item in data:
        if not (isinstance(item, list) and all(isinstance(x, str) for x in item)):
            return None
        if not (item[:1] == ["unreadable"] and len(item) == 2) and not (
            item[:1] in (["dist"], ["badline"]) and len(item) == 3
        ):
            return None
    return data


def load(cache: str, folder: str, mark: list[Any], code: int) -> Items | None:
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
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("code") != code:
        return None
    if data.get("folder") != folder or data.get("fingerprint") != mark:
        return None
    return _items(data.get("items"))


def save(cache: str, folder: str, mark: list[Any], code: int, items: Items) -> None:
    """Written whole or not at all (a temporary file renamed); a cache that cannot be written
    is no cache, never a failed precheck."""
    tmp = _file(cache, folder) + f".tmp-{os.getpid()}"
    entry = {"schema": SCHEMA, "code": code, "folder": folder, "fingerprint": mark}
    try:
        os.makedirs(cache, mode=0o700, exist_ok=True)
        if not _private(os.stat(cache)):
            return
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(dict(entry, items=items), f)
        os.replace(tmp, _file(cache, folder))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def listing(read: Callable[[str], Items], code: str) -> tuple[Items, str] | None:
    """Every folder of sys.path listed by `read` or from the cache, in order, and how many
    came from the cache, in words; None where there is no cache to use (no folder for it, or
    another finder of distributions: the caller then lists the whole path in one go, as
    importlib.metadata does). `code`: the file that formats the lines (see code_mark)."""
    cache = where()
    mark_code = code_mark(code) if cache is not None and only_path_finder() else None
    if cache is None or mark_code is None:
        return None
    items: Items = []
    kept = total = 0
    for folder in sys.path:
        mark = fingerprint(folder)
        if mark == []:  # nothing is installed there
            continue
        total += 1
        found = load(cache, folder, mark, mark_code) if mark is not None else None
        if found is None:
            found = read(folder)
            if mark is not None:
                save(cache, folder, mark, mark_code, found)
        else:
            kept += 1
        items.extend(found)
    return items, f"{kept} of {total} folders from the cache"
