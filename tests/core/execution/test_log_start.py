"""Where `orbit logs --tail N --since WHEN` starts reading: over a real attempt folder (the
local backends' reads), with the times the wrapper notes as its task's log grows."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orbit.core.execution import log_start as ls
from orbit.core.execution.backends.local_files import LocalFiles
from orbit.model.errors import InvalidInput
from orbit.model.layers import LogLayer
from orbit.model.models import RunHandle
from orbit.runtime import records

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def folder(tmp_path: Path, training: bytes, times: str | None = None) -> RunHandle:
    (tmp_path / "artifacts").mkdir(parents=True)
    (tmp_path / "runtime").mkdir()
    (tmp_path / "artifacts" / "training.log").write_bytes(training)
    if times is not None:
        (tmp_path / records.TIMES_RELPATH).write_text(times)
    return RunHandle(backend_key="local", target="here", attempt_id="a", location=str(tmp_path))


def tail(handle: RunHandle, n: int) -> bytes:
    start = ls.log_start(LocalFiles(), handle, LogLayer.TRAINING, lines=n)
    return (Path(handle.location) / "artifacts" / "training.log").read_bytes()[start:]


@pytest.mark.parametrize(
    ("data", "n", "at"),
    [
        (b"a\nb\nc\n", 1, 4),
        (b"a\nb\nc\n", 2, 2),
        (b"a\nb\nc\n", 3, None),  # the first line's start is not in view: read further back
        (b"a\nb\nc", 1, 4),  # a line cut short at the end counts as one
        (b"a\nb\nc", 0, 5),
        (b"", 1, None),
    ],
)
def test_where_the_last_lines_begin(data: bytes, n: int, at: int | None) -> None:
    assert ls.last_lines_at(data, n) == at


def test_tail_reads_back_further_for_long_lines_and_stops_at_the_start(tmp_path: Path) -> None:
    long = b"x" * 100_000 + b"\n"  # longer than the first look at the end
    handle = folder(tmp_path, b"first\n" + long * 3 + b"last")
    assert tail(handle, 1) == b"last"
    assert tail(handle, 3) == long * 2 + b"last"
    assert tail(handle, 5) == b"first\n" + long * 3 + b"last"  # fewer lines than asked: all
    assert tail(handle, 50) == tail(handle, 5)
    assert tail(handle, 0) == b""


def test_since_starts_after_the_last_mark_before_it_at_a_line(tmp_path: Path) -> None:
    log = b"one\ntwo\nthree\nfour\n"
    marks = "".join(
        f"{(T0 + timedelta(seconds=s)).isoformat()} {size}\n"
        for s, size in ((1, 4), (3, 10), (5, 19))  # 10: inside "three"
    )
    handle = folder(tmp_path, log, marks + "2026-05-01T12:00:0")  # cut short by a crash

    def since(seconds: float, lines: int | None = None) -> bytes:
        when = T0 + timedelta(seconds=seconds)
        return log[ls.log_start(LocalFiles(), handle, LogLayer.TRAINING, lines, when) :]

    assert since(0) == log  # before the first mark: everything
    assert since(1) == since(2) == b"two\nthree\nfour\n"
    assert since(4) == b"four\n"  # a line begun before WHEN goes with what came before
    assert since(9) == b""
    assert since(0, lines=1) == b"four\n"
    assert since(1, lines=5) == b"two\nthree\nfour\n"


def test_since_without_times_is_refused_unless_nothing_was_written(tmp_path: Path) -> None:
    handle = folder(tmp_path / "old", b"written by an older bundle\n")
    with pytest.raises(InvalidInput, match=r"^since: .*no times.*--tail N"):
        ls.log_start(LocalFiles(), handle, LogLayer.TRAINING, since=T0)
    empty = folder(tmp_path / "new", b"")
    assert ls.log_start(LocalFiles(), empty, LogLayer.TRAINING, since=T0) == 0


def test_runtime_since_reads_the_lines_own_times(tmp_path: Path) -> None:
    handle = folder(tmp_path, b"")
    lines = [
        f"{(T0 + timedelta(seconds=1)).isoformat()} staging\n",
        "  a line of the one before\n",
        f"{(T0 + timedelta(seconds=3)).isoformat()} starting task\n",
        f"{(T0 + timedelta(seconds=5)).isoformat()} task exited with 0\n",
    ]
    text = "".join(lines).encode()
    (tmp_path / "runtime" / "runtime.log").write_bytes(text)
    start = ls.log_start(LocalFiles(), handle, LogLayer.RUNTIME, since=T0 + timedelta(seconds=2))
    assert text[start:].decode() == "".join(lines[2:])
    start = ls.log_start(LocalFiles(), handle, LogLayer.RUNTIME, since=T0 + timedelta(seconds=6))
    assert text[start:] == b""


def test_the_wrapper_marks_the_size_only_as_the_log_grows(tmp_path: Path) -> None:
    log, times = tmp_path / "training.log", tmp_path / "training.times"
    marks = records.LogTimes(str(log), str(times))
    marks.mark(force=True)  # no log yet: nothing
    log.write_bytes(b"a\n")
    before = datetime.now(UTC)
    marks.mark(force=True)
    marks.mark(force=True)  # the same size: no second mark
    marks.mark()  # too soon after the last look
    with log.open("ab") as f:
        f.write(b"b\n")
    marks.mark()  # too soon: not yet
    assert times.read_text().count("\n") == 1
    time.sleep(records.MARK_S)
    marks.mark()
    found = [line.split(" ") for line in times.read_text().splitlines()]
    assert [int(size) for _, size in found] == [2, 4]
    assert all(datetime.fromisoformat(at) >= before - timedelta(seconds=1) for at, _ in found)
    assert records.offset_at(times.read_bytes(), before - timedelta(seconds=5)) == 0
    assert records.offset_at(times.read_bytes(), datetime.now(UTC)) == 4
