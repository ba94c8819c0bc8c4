"""The key set that seals secrets (orbit.model.secret_keys), as a server or a command holds it:
from ORBIT_SECRET_KEYS, or from its file, made on first use and read again whenever it changes
on disk, so that a rotation made by one replica of `orbit server` is picked up by the others at
their next use of a secret."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from orbit.model.errors import InvalidInput
from orbit.model.secret_keys import KeySet, load_key_set, parse_key_set, save_key_set

VARIABLE = "ORBIT_SECRET_KEYS"


class Keyring:
    """The key set, from ORBIT_SECRET_KEYS or the file at `path` (re-read when it changes)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._keys: KeySet | None = None
        self._seen: tuple[int, int, int] | None = None  # the file's version when read

    def keys(self) -> KeySet:
        with self._lock:
            variable = os.environ.get(VARIABLE)
            if variable:
                if self._keys is None:
                    self._keys = parse_key_set(variable, VARIABLE)
                return self._keys
            if self.path is None:
                raise InvalidInput("this control plane was given no secret key set")
            now = _version(self.path)
            if self._keys is None or now != self._seen:
                self._keys = load_key_set(self.path)
                self._seen = _version(self.path)
            return self._keys

    @property
    def source(self) -> str:
        """Where the keys come from, as an error names it."""
        return VARIABLE if os.environ.get(VARIABLE) else str(self.path)

    def save(self, keys: KeySet) -> None:
        if os.environ.get(VARIABLE):
            raise InvalidInput(
                f"the secret keys come from {VARIABLE}: add the new key where they are kept "
                "and restart, rather than rotate here"
            )
        with self._lock:
            if self.path is None:
                raise InvalidInput("this control plane was given no secret key set")
            save_key_set(self.path, keys)
            self._keys, self._seen = None, None


def _version(path: Path) -> tuple[int, int, int] | None:
    """What changes whenever the file is replaced (each save is a new file: a new inode)."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size)
