"""A followed log is read once for all who follow it (orbit.server.ui.taps): many followers of
one run cost one reader; each gets every byte in order from its own offset, one far behind
reads for itself until it catches up, and all see the end once the attempt has ended and its
last bytes are in."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from orbit.server.ui import taps
from orbit.server.ui.taps import LogTaps, read_behind


class FileLog:
    """A log file as the tap reads it (LogFollower: read from an offset, ended), counting
    the reads."""

    def __init__(self, path: Path) -> None:
        self.path, self.reads, self.done = path, 0, False

    def read(self, offset: int) -> bytes:
        self.reads += 1
        with self.path.open("rb") as f:
            f.seek(offset)
            return f.read(64 * 1024)

    def ended(self) -> bool:
        return self.done


async def follow(hub: LogTaps, log: FileLog, offset: int) -> bytes:
    """What a follower gets from `offset` until the end (as live.py's _follow reads a tap)."""
    key = ("run-1", 1, "training")
    tap = await hub.join(key, offset, lambda: log)  # type: ignore[arg-type, return-value]
    got = b""
    try:
        while True:
            moved, ended = tap.moved, tap.ended
            data = tap.since(offset)
            if data is None:
                data = await read_behind(tap, offset)
            if data:
                offset += len(data)
                got += data
                continue
            if ended:
                return got
            await asyncio.wait_for(moved.wait(), 5)
    finally:
        hub.leave(key, tap)


def test_many_followers_share_one_reader_and_each_gets_every_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(taps, "POLL_S", 0.05)
    monkeypatch.setattr(taps, "KEEP_BYTES", 4096)
    monkeypatch.setattr(taps, "ENDED_EVERY_S", 0.1)
    path = tmp_path / "task.log"
    old = b"".join(b"old line %05d\n" % i for i in range(2000))  # 30 KB before anyone follows
    path.write_bytes(old)
    log = FileLog(path)

    async def scenario() -> list[bytes]:
        async def stamp() -> str:
            return "same"

        hub = LogTaps(stamp)
        end = len(old)
        followers = [asyncio.create_task(follow(hub, log, end)) for _ in range(50)]
        behind = asyncio.create_task(follow(hub, log, 0))  # a resume from the start
        for i in range(20):
            with path.open("ab") as f:
                f.write(b"new line %d\n" % i)
            await asyncio.sleep(0.06)
        log.done = True
        return await asyncio.wait_for(asyncio.gather(*followers, behind), 30)

    got = asyncio.run(scenario())
    new = path.read_bytes()[len(old) :]
    assert [len(g) for g in got[:-1]] == [len(new)] * 50
    assert all(g == new for g in got[:-1]), "a follower missed or doubled a line"
    assert got[-1] == old + new, "the follower from the start missed the part the tap let go"
    # one reader polling a few times a second for 1.2 s, and the one behind catching up: not
    # 51 followers each reading every poll (that would be over 1,000 reads)
    assert log.reads < 150, log.reads


def test_the_last_follower_leaving_stops_the_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(taps, "POLL_S", 0.02)
    path = tmp_path / "task.log"
    path.write_bytes(b"")
    log = FileLog(path)

    async def scenario() -> int:
        async def stamp() -> str:
            return "same"

        hub = LogTaps(stamp)
        task = asyncio.create_task(follow(hub, log, 0))
        await asyncio.sleep(0.2)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert hub.taps == {}
        await asyncio.sleep(0.1)  # its reader's turn comes, sees nobody, stops
        reads = log.reads
        await asyncio.sleep(0.3)
        return log.reads - reads

    assert asyncio.run(scenario()) == 0, "the log is still read with nobody following it"
