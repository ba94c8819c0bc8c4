"""How far a transfer got, told to whoever shows it: a submission's inputs going up, a
collect, a file pushed to a node or pulled from one. A Meter is handed to RemoteControl (the
CLI's draws a bar on a terminal, orbit.cli.progress); the transfers tell it each byte count
as they go, and QUIET, the default, tells nobody."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import IO, Protocol

Tick = Callable[[int], None]  # the bytes moved so far (not since the last tick)


class Meter(Protocol):
    def track(self, what: str, total: int | None) -> AbstractContextManager[Tick]:
        """While the transfer `what` of `total` bytes (None: unknown) moves: its tick."""
        ...


class _Quiet:
    @contextlib.contextmanager
    def track(self, what: str, total: int | None) -> Iterator[Tick]:
        yield lambda moved: None


QUIET: Meter = _Quiet()


class MeteredFile:
    """A binary file whose reads tick (httpx sends a multipart file as it reads it, 64 KiB at
    a time); its size is read as httpx reads it, from fileno() or by seeking to the end."""

    def __init__(self, file: IO[bytes], tick: Tick) -> None:
        self.file, self.tick = file, tick

    def read(self, size: int = -1, /) -> bytes:
        block = self.file.read(size)
        self.tick(self.file.tell())
        return block

    def seek(self, offset: int, whence: int = 0, /) -> int:
        return self.file.seek(offset, whence)

    def tell(self) -> int:
        return self.file.tell()

    def fileno(self) -> int:
        return self.file.fileno()
