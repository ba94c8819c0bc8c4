"""Files for their owner. $ORBIT_HOME and the store hold everyone's runs, tokens' hashes and a
server's admin token, so what ORBIT creates there is readable by ORBIT's user only: folders
0700, files 0600. `orbit server` sets its umask to 077 (PRIVATE_UMASK) at start; the embedded
CLI runs in the user's own process and keeps the user's umask for what it writes elsewhere
(`collect`'s copies are the user's to share), so it makes its own folders 0700 instead."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077
# what ORBIT keeps under $ORBIT_HOME: the bundle cache, local attempts, agent attempts' files
HOME_FOLDERS = ("bundles", "work", "artifacts")
# the files SQLite keeps beside a store's file
SQLITE_SIDES = ("-wal", "-shm", "-journal")


def private_home(home: Path) -> None:
    """$ORBIT_HOME and the folders ORBIT keeps in it, made 0700 where they are made now (one
    that exists is the user's as it is)."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in HOME_FOLDERS:
        (home / name).mkdir(mode=0o700, exist_ok=True)


def private_store(path: Path) -> None:
    """A SQLite store's file, made 0600 before SQLite first opens it (SQLite gives its -wal
    and -shm the mode of the file); one made before this, and its side files, lose their
    group and other bits."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # read-only, say: SQLite says what is wrong with it
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for each in (path, *(path.with_name(path.name + side) for side in SQLITE_SIDES)):
        _owner_only(each)


def _owner_only(path: Path) -> None:
    with contextlib.suppress(OSError):  # gone meanwhile, or not ours: SQLite says so if it must
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            path.chmod(mode & ~0o077)
