"""A run's GPU chart covers the whole run: the per-minute file for the part before the
per-second tail, the tail second by second, each cut to the chart's width, in time order."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from orbit.forensics.series import gpu_series, gpu_window, refresh_s

START = datetime(2026, 11, 28, 8, 0, tzinfo=UTC)


def line(at: datetime, index: int, util: float, mem_mib: int, **more: object) -> bytes:
    record = {
        "ts": at.isoformat(timespec="milliseconds"),
        "index": index,
        "name": "H200",
        "util_gpu": util,
        "mem_used_mib": mem_mib,
        "power_w": 300.0,
        "temp_c": 60,
        **more,
    }
    return (json.dumps(record, sort_keys=True) + "\n").encode()  # fmt: skip


def test_a_day_long_run_is_charted_whole_and_its_last_minutes_second_by_second() -> None:
    hours = 24
    minutes = b"".join(
        line(START + timedelta(minutes=m), gpu, util=float(m % 100), mem_mib=1024, samples=60)
        for m in range(hours * 60)
        for gpu in range(2)
    )
    tail_from = START + timedelta(hours=hours) - timedelta(minutes=10)
    seconds = b"".join(
        line(tail_from + timedelta(seconds=s), gpu, util=100.0, mem_mib=2048)
        for s in range(600)
        for gpu in range(2)
    )
    torn = seconds[7:]  # a tail read from the middle of a line
    charts = gpu_series(torn, points=300, minutes=minutes)
    assert sorted(charts["gpus"]) == ["0", "1"] and charts["unavailable"] is None
    xs, util, mem, power, temp = charts["gpus"]["0"]["data"]
    assert xs == sorted(xs) and len(xs) == len(util) == len(mem) == len(power) == len(temp)
    # the whole day is there, from the first minute
    assert xs[0] < (START + timedelta(minutes=5)).timestamp()
    assert xs[-1] >= (tail_from + timedelta(seconds=598)).timestamp()
    recent = [i for i, x in enumerate(xs) if x >= tail_from.timestamp()]
    older = [i for i, x in enumerate(xs) if x < tail_from.timestamp()]
    # each part cut to the width: the day's minutes to 300 points, the tail's 600 s to 300
    assert len(older) <= 300 and len(recent) == 300
    assert all(util[i] == 100.0 and mem[i] == 2.0 for i in recent)
    assert all(mem[i] == 1.0 for i in older), "a minute the tail covers was drawn twice"
    assert charts["gpus"]["1"]["name"] == "H200"


def test_without_the_minutes_file_the_tail_alone_is_drawn() -> None:
    seconds = b"".join(line(START + timedelta(seconds=s), 0, 50.0, 4096) for s in range(30))
    charts = gpu_series(seconds)
    xs, util, mem, *_ = charts["gpus"]["0"]["data"]
    assert len(xs) == 30 and set(util) == {50.0} and set(mem) == {4.0}
    unavailable = (
        b'{"ts": "2026-11-28T08:00:00+00:00", "nvml": "unavailable", "reason": "no GPU"}\n'
    )
    assert gpu_series(unavailable) == {"gpus": {}, "unavailable": "no GPU"}


def test_a_zoom_into_an_hour_of_a_day_reads_a_few_probes_and_draws_every_second(
    tmp_path: Path,
) -> None:
    """gpu_window finds the span in a day-long per-second audit by interpolation (a handful of
    small reads, not the file) and gives every sample in it."""
    audit = tmp_path / "nvml-audit.jsonl"
    with audit.open("wb") as out:
        for s in range(24 * 3600):
            at = START + timedelta(seconds=s)
            out.write(line(at, 0, float(s % 100), 1024) + line(at, 1, 50.0, 2048))
    size = audit.stat().st_size
    reads: list[tuple[int, int]] = []

    def read(offset: int, limit: int) -> bytes:
        reads.append((offset, limit))
        with audit.open("rb") as f:
            f.seek(offset)
            return f.read(limit)

    begin = (START + timedelta(hours=13, minutes=7)).timestamp()
    found = gpu_window(read, size, begin, begin + 1200)
    xs, util, *_ = found["gpus"]["0"]["data"]
    assert len(xs) == 1201 and xs[0] == begin and xs[-1] == begin + 1200
    assert util[:3] == [float((13 * 3600 + 420 + s) % 100) for s in range(3)]
    assert found["truncated"] is False and len(found["gpus"]["1"]["data"][0]) == 1201
    assert sum(limit for _, limit in reads) < 4 * 1024 * 1024, "read most of a 40 MB file"
    assert len(reads) < 16, reads
    # before the first sample and past the last: what there is, nothing made up
    assert gpu_window(read, size, START.timestamp() - 600, START.timestamp() - 1)["gpus"] == {}


def test_a_long_runs_charts_are_asked_for_less_often() -> None:
    day = {"0": {"data": [[0.0, 86_400.0]]}}
    hour = {"0": {"data": [[0.0, 3_600.0]]}, "1": {"data": [[]]}}
    assert refresh_s(day) == 30.0 and refresh_s(hour) == 5.0 and refresh_s({}) == 5.0
    assert refresh_s({"0": {"data": [[0.0, 12_000.0]]}}) == 12.0
