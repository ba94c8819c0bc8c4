"""The audit key: 32 random bytes in a file outside the database (by default
$ORBIT_HOME/audit-key, or ORBIT_AUDIT_KEY_FILE), readable by its owner only, made on first use.
The store keys the audit chain with it (orbit.model.audit_chain), so that someone who can write
the database but not this file cannot re-hash the chain or cut it short unnoticed.

Every process that writes to one store must hold the same key: replicas of `orbit server`
share $ORBIT_HOME (or point ORBIT_AUDIT_KEY_FILE at one copy), and a store copied elsewhere
takes its key along. Lose the key and the keyed part of the chain can no longer be verified."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from orbit.model.errors import InvalidInput

KEY_BYTES = 32


def load_audit_key(path: Path) -> bytes:
    """The key in `path`, made there first (mode 0600) when there is none. Processes that
    start together agree: the file appears whole, in one link, and the loser reads it."""
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(secrets.token_hex(KEY_BYTES) + "\n")
            out.flush()
            os.fsync(out.fileno())
        with contextlib.suppress(FileExistsError):  # never replace a key made meanwhile
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return _read(path)


def _read(path: Path) -> bytes:
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not text"
        raise InvalidInput(f"audit key {path}: {why} (ORBIT_AUDIT_KEY_FILE)") from None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise InvalidInput(
            f"audit key {path}: not a key ORBIT wrote ({KEY_BYTES * 2} hex digits); restore "
            "the store's own key (ORBIT_AUDIT_KEY_FILE)"
        )
    return key
