"""Folders on disk: how large (without following links), removed (renamed aside first, so that a
reader never sees half of one), and how much room is left."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

TRASH_PREFIX = ".removing-"  # a folder renamed for removal: removed whole, even after a crash


def measure(path: Path) -> tuple[int, int]:
    """(bytes, files) under `path` (a file: itself); links are counted as links, never
    followed. Nothing there: (0, 0)."""
    try:
        top = path.lstat()
    except OSError:
        return 0, 0
    if not path.is_dir() or path.is_symlink():
        return top.st_size, 1
    size = files = 0
    stack = [str(path)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue  # gone meanwhile, or unreadable: not ours to count
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    size += entry.stat(follow_symlinks=False).st_size
                    files += 1
            except OSError:
                continue
    return size, files


def remove(path: Path) -> tuple[int, int]:
    """Remove a file or folder; (bytes, files) it held. A folder is first renamed aside in its
    own parent (one atomic step: whoever reads it sees all of it or none), then removed."""
    size, files = measure(path)
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
        return size, files
    if not path.exists():
        return 0, 0
    aside = path.with_name(f"{TRASH_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return 0, 0
    shutil.rmtree(aside, ignore_errors=True)
    return size, files


def sweep_trash(folder: Path) -> None:
    """What a removal cut short (a crash between the rename and its end) left in `folder`."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith(TRASH_PREFIX):
            shutil.rmtree(entry, ignore_errors=True)


def free_fraction(path: Path) -> float:
    """The share of the filesystem holding `path` that is free (for an unprivileged user)."""
    found = shutil.disk_usage(path)
    return found.free / found.total if found.total else 1.0


def human(count: float) -> str:
    """Bytes as people read them: 0 B, 812 B, 1.4 KB, 3.0 MB, 12.5 GB (powers of 1000)."""
    value = float(count)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} PB"
