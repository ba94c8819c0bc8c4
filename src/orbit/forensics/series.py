"""What a run's charts draw, from the files it leaves: each GPU's utilization, memory, power and
temperature over time from the NVML audit (the whole run from artifacts/nvml-minutes.jsonl,
one line per GPU per minute, and its last minutes at full resolution from the tail of
artifacts/nvml-audit.jsonl, one line per GPU per second), and the loss over steps from
logging.jsonl. Long series are cut to at most `points` by averaging equal spans of time, so a
day of samples costs a page a few kilobytes; the recent part keeps its own `points`, so that a
chart zoomed on the last minutes shows them second by second."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from orbit.forensics.progress import _number, _step

NVML_FILE = "artifacts/nvml-audit.jsonl"
NVML_TAIL_BYTES = 2 * 1024 * 1024  # about 15 minutes of 8 GPUs at one line each a second
NVML_MINUTES_FILE = "artifacts/nvml-minutes.jsonl"
NVML_MINUTES_BYTES = 4 * 1024 * 1024  # about 40 hours of 8 GPUs at one line each a minute
LOSS_TAIL_BYTES = 2 * 1024 * 1024
POINTS = 600  # a chart's width in points: enough for a laptop screen
GPU_FIELDS = {
    "util": "util_gpu",
    "mem_gib": "mem_used_mib",
    "power_w": "power_w",
    "temp_c": "temp_c",
}


def _lines(data: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a file's lines; a torn first or last line (a tail) is skipped."""
    found = []
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            found.append(record)
    return found


def _time(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def downsample(xs: list[float], columns: list[list[float | None]], points: int) -> list[list[Any]]:
    """[xs, *columns] cut to at most `points` rows: each row the mean of one equal span of x
    (a span with no value in a column stays None there, a gap in the chart)."""
    if len(xs) <= points:
        return [xs, *columns]
    start, span = xs[0], (xs[-1] - xs[0]) / points or 1.0
    out_x: list[float] = []
    out_cols: list[list[float | None]] = [[] for _ in columns]
    bucket: list[int] = []
    current = 0

    def flush() -> None:
        if not bucket:
            return
        out_x.append(sum(xs[i] for i in bucket) / len(bucket))
        for col, out in zip(columns, out_cols, strict=True):
            values = [v for v in (col[i] for i in bucket) if v is not None]
            out.append(round(sum(values) / len(values), 3) if values else None)
        bucket.clear()

    for i, x in enumerate(xs):
        index = min(int((x - start) / span), points - 1)
        if index != current:
            flush()
            current = index
        bucket.append(i)
    flush()
    return [out_x, *out_cols]


def _by_gpu(data: bytes) -> tuple[dict[int, list[tuple[float, dict[str, Any]]]], str | None]:
    """Each GPU's (time, record) in time order, and why NVML was unavailable if it said so."""
    by_gpu: dict[int, list[tuple[float, dict[str, Any]]]] = {}
    unavailable = None
    for record in _lines(data):
        if record.get("nvml") == "unavailable":
            unavailable = str(record.get("reason") or "NVML unavailable")
            continue
        index = record.get("index")
        t = _time(record.get("ts"))
        if isinstance(index, int) and not isinstance(index, bool) and t is not None:
            by_gpu.setdefault(index, []).append((t, record))
    for rows in by_gpu.values():
        rows.sort(key=lambda row: row[0])
    return by_gpu, unavailable


def _columns(rows: list[tuple[float, dict[str, Any]]], points: int) -> list[list[Any]]:
    xs = [t for t, _ in rows]
    columns: list[list[float | None]] = []
    for name, key in GPU_FIELDS.items():
        values = [_number(r.get(key)) for _, r in rows]
        if name == "mem_gib":
            values = [None if v is None else round(v / 1024, 3) for v in values]
        columns.append(values)
    return downsample(xs, columns, points)


def gpu_series(data: bytes, points: int = POINTS, minutes: bytes = b"") -> dict[str, Any]:
    """Per GPU index: [times (epoch s), util %, memory GiB, power W, temperature C]: the
    minutes (`minutes`, nvml-minutes.jsonl) before the per-second lines of `data` begin, cut
    to `points`, then those lines, cut to `points`; and why there is none when the audit says
    NVML was unavailable."""
    seconds, unavailable = _by_gpu(data)
    earlier, _ = _by_gpu(minutes)
    gpus: dict[str, Any] = {}
    for index in sorted(set(seconds) | set(earlier)):
        recent = seconds.get(index, [])
        begins = recent[0][0] if recent else float("inf")
        older = [(t, r) for t, r in earlier.get(index, []) if t + 60 <= begins]
        before, after = _columns(older, points), _columns(recent, points)
        named = (recent or older)[-1][1].get("name")
        gpus[str(index)] = {
            "name": str(named or f"GPU {index}"),
            "data": [a + b for a, b in zip(before, after, strict=True)],
        }
    return {"gpus": gpus, "unavailable": None if gpus else unavailable}


REFRESH_MIN_S, REFRESH_MAX_S = 5.0, 30.0


def refresh_s(gpus: dict[str, Any], width: int = 1000) -> float:
    """How often a live run's charts are worth asking for again: as often as a point of a
    chart `width` points wide moves on (the span over the width), 5 to 30 s: a day-long run's
    charts every 30 s, an hour's every 5."""
    ends = [g["data"][0][i] for g in gpus.values() if g["data"][0] for i in (0, -1)]
    span = max(ends) - min(ends) if ends else 0.0
    return round(min(REFRESH_MAX_S, max(REFRESH_MIN_S, span / width)), 1)


def loss_series(data: bytes, points: int = POINTS) -> list[list[Any]]:
    """[steps, losses] from logging.jsonl lines that say both, cut to `points`."""
    pairs: dict[int, float] = {}
    for record in _lines(data):
        step, _ = _step(record)
        loss = _number(record.get("loss", record.get("train_loss")))
        if step is not None and loss is not None:
            pairs[step] = loss
    steps = sorted(pairs)
    return downsample([float(s) for s in steps], [[pairs[s] for s in steps]], points)


ZOOM_MAX_S = 1800.0  # a zoom of at most this long is drawn second by second
ZOOM_MAX_BYTES = 32 * 1024 * 1024  # the most of the audit one zoom reads
PROBE_BYTES = 64 * 1024  # what one look into the audit reads to find a time in it
CHUNK_BYTES = 1024 * 1024


def _first_time(data: bytes, whole_first_line: bool) -> float | None:
    """The time of the first line of `data` that it holds whole (its first is cut unless
    `whole_first_line`)."""
    lines = data.split(b"\n")
    for line in lines[0 if whole_first_line else 1 : -1]:
        t = _time(_ts_of(line))
        if t is not None:
            return t
    return None


def window_offset(read: Callable[[int, int], bytes], size: int, start: float) -> int:
    """Where in an audit of `size` bytes (lines in time order) the lines from `start` begin, or
    a little before: an interpolation search, a few reads of PROBE_BYTES through `read(offset,
    limit)`, however long the file (its lines come at a steady rate)."""
    lo, hi = 0, size
    t_lo = _first_time(read(0, PROBE_BYTES), True)
    if t_lo is None or start <= t_lo:
        return 0
    t_hi = _first_time(read(max(size - PROBE_BYTES, 0), PROBE_BYTES), size <= PROBE_BYTES)
    if t_hi is None or t_hi <= t_lo:
        t_hi = t_lo + 1.0
    for _ in range(24):
        rate = (hi - lo) / max(t_hi - t_lo, 1e-9)  # bytes a second, here
        if hi - lo <= PROBE_BYTES or (start - t_lo) * rate <= CHUNK_BYTES:
            break  # reading on from lo costs no more than a chunk
        guess = lo + int((start - t_lo) * rate) - PROBE_BYTES // 4  # land a little before
        guess = min(max(guess, lo + 1), hi - 1)
        t = _first_time(read(guess, PROBE_BYTES), False)
        if t is None or t > start:
            hi = guess
            if t is not None:
                t_hi = t
        else:
            lo, t_lo = guess, t
    return lo


def gpu_window(
    read: Callable[[int, int], bytes], size: int, start: float, end: float
) -> dict[str, Any]:
    """Each GPU's samples between `start` and `end` (epoch seconds) at full resolution, read
    from the audit through `read` (at most ZOOM_MAX_BYTES of it): what a chart zoomed into a
    part of a long run draws."""
    offset = window_offset(read, size, start)
    kept: list[bytes] = []
    read_bytes = 0
    carry = b""
    done = False
    while not done and offset < size and read_bytes < ZOOM_MAX_BYTES:
        data = read(offset, CHUNK_BYTES)
        if not data:
            break
        offset += len(data)
        read_bytes += len(data)
        lines = (carry + data).split(b"\n")
        carry = lines.pop()
        for line in lines:
            t = _time(_ts_of(line))
            if t is None or t < start:
                continue
            if t > end:
                done = True
                break
            kept.append(line)
    width = int(ZOOM_MAX_S) + 1
    found = gpu_series(b"\n".join(kept) + b"\n", points=width)
    found.update({"from": start, "to": end, "truncated": read_bytes >= ZOOM_MAX_BYTES})
    return found


def _ts_of(line: bytes) -> str | None:
    """A line's `ts`, without parsing the whole line where it is where nvml_audit.py puts it."""
    at = line.find(b'"ts": "')
    if at < 0:
        return None
    close = line.find(b'"', at + 7)
    return line[at + 7 : close].decode("ascii", "replace") if close > 0 else None
