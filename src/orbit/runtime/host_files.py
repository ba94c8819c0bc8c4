"""Files in folders a task may write too (an attempt's runtime/ and artifacts/), read and
written without trusting what is there: never through a link, never waiting on a fifo, and
no more of a file than a look needs. Standard library only: it travels beside hostside
(scripts/orbit_host_files.py; see orbit.runtime.hostside)."""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import shutil
import stat

# a task may leave a link, a fifo or a device where ORBIT reads (its runtime/, artifacts/):
# never followed, never waited on, and only a plain file is read
READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


MAX_STATE_BYTES = 1 << 20  # the most of a runtime file (status, result, pid) a look reads


def open_file(path: str) -> int:
    """A read-only descriptor of the plain file at `path`, never through a link in its
    place; FileNotFoundError for anything else (a link, a fifo, a folder, a device: looked at
    before it is opened, since opening some devices acts)."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise FileNotFoundError(errno.ENOENT, f"not a plain file: {path}")
        fd = os.open(path, READ_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise FileNotFoundError(exc.errno, f"not a plain file: {path}") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileNotFoundError(errno.ENOENT, f"not a plain file: {path}")
    return fd


def read_text(path: str) -> str | None:
    """The text of the plain file at `path` (its first MAX_STATE_BYTES); None if none."""
    try:
        with os.fdopen(open_file(path), encoding="utf-8", errors="replace") as f:
            return f.read(MAX_STATE_BYTES)  # a task may have made it as large as it likes
    except (FileNotFoundError, NotADirectoryError):
        return None


def write_nofollow(path: str, text: str) -> None:
    """Write a file in a folder a task may write too (its runtime/): a new file under a name
    no one can guess, renamed into place, so that whatever the task left there (a link, a
    fifo, a device) is replaced, never written through nor waited on by this process (an
    agent as root, say)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    tmp = f"{path}.tmp-{os.getpid()}-{base64.b32encode(os.urandom(5)).decode().lower()}"
    fd = os.open(tmp, flags, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)  # a folder in its place
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
