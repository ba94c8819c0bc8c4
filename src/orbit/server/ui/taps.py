"""A followed log read once for everyone who follows it: one tap per (run, attempt, layer), a
task that reads the log where it runs (a file here, a command over SSH, an agent's report)
once a second while anyone listens, keeps its newest bytes, and wakes its followers when
more came or the attempt ended. A hundred consoles on one run cost one read a second, not a
hundred; a follower behind what the tap keeps (a resume from long ago) reads for itself until
it catches up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

from orbit.core.control.attempt_files import LogFollower
from orbit.model.errors import OrbitError

POLL_S = 1.0  # how often a quiet log is read (a file read, or a command over SSH)
ENDED_EVERY_S = 5.0  # a quiet log asks whether its attempt ended at least this often
KEEP_BYTES = 1 << 20  # the newest bytes a tap keeps for followers a little behind

Key = tuple[str, int, str]  # run id, attempt number, layer


@dataclass
class Tap:
    """What one log's reader has seen: `recent`, the bytes from `start` to `end`; `ended`
    once the attempt ended and its last bytes were read; `problem` when reading failed."""

    reader: LogFollower
    start: int
    recent: bytes = b""
    ended: bool = False
    problem: str | None = None
    followers: int = 0
    moved: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def end(self) -> int:
        return self.start + len(self.recent)

    def since(self, offset: int) -> bytes | None:
        """What it holds from `offset` on; None when `offset` is before what it keeps."""
        if offset < self.start:
            return None
        return self.recent[offset - self.start :]

    def _add(self, data: bytes) -> None:
        recent = self.recent + data
        if len(recent) > KEEP_BYTES:
            self.start += len(recent) - KEEP_BYTES
            recent = recent[-KEEP_BYTES:]
        self.recent = recent
        self._wake()

    def _wake(self) -> None:
        moved, self.moved = self.moved, asyncio.Event()
        moved.set()


class LogTaps:
    """The taps now followed; `stamp` is the store's change stamp (whether any attempt moved),
    shared with the console's other live parts."""

    def __init__(self, stamp: Callable[[], Awaitable[str]]) -> None:
        self.stamp = stamp
        self.taps: dict[Key, Tap] = {}

    async def join(self, key: Key, offset: int, make: Callable[[], LogFollower]) -> Tap:
        """The key's tap, started at `offset` if nobody follows that log yet; `leave` it."""
        tap = self.taps.get(key)
        if tap is None:
            reader = await anyio.to_thread.run_sync(make)  # a read of the store: may raise
            made = Tap(reader, offset)
            tap = self.taps.setdefault(key, made)  # another follower may have come meanwhile
            if tap is made:
                asyncio.get_running_loop().create_task(self._read(key, tap))
        tap.followers += 1
        return tap

    def leave(self, key: Key, tap: Tap) -> None:
        tap.followers -= 1
        if tap.followers <= 0 and self.taps.get(key) is tap:
            del self.taps[key]  # its reader stops at its next turn

    async def _read(self, key: Key, tap: Tap) -> None:
        seen, asked, ending = await self.stamp(), 0.0, False  # its first quiet read asks
        while self.taps.get(key) is tap:
            try:
                data = await anyio.to_thread.run_sync(tap.reader.read, tap.end)
                if data:
                    tap._add(data)
                    continue
                if ending:  # ended, and what it wrote last is in
                    tap.ended = True
                    break
                now = await self.stamp()
                if now != seen or time.monotonic() - asked > ENDED_EVERY_S:
                    seen, asked = now, time.monotonic()
                    ending = await anyio.to_thread.run_sync(tap.reader.ended)
                    if ending:
                        continue
            except OrbitError as exc:
                tap.problem = str(exc)
                break
            await asyncio.sleep(POLL_S)
        if self.taps.get(key) is tap:
            del self.taps[key]  # a later follower starts a new one (a retry's next attempt)
        tap._wake()


async def read_behind(tap: Tap, offset: int) -> bytes:
    """From `offset`, before what the tap keeps: read for this follower alone."""
    return await anyio.to_thread.run_sync(tap.reader.read, offset)
