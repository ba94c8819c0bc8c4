#!/usr/bin/env python3
"""ORBIT NVML audit sidecar: one JSON line per GPU per tick in artifacts/nvml-audit.jsonl, and
one per GPU per minute in artifacts/nvml-minutes.jsonl.

It travels inside the bundle (scripts/orbit_nvml.py, beside the vendored scripts/pynvml.py
from nvidia-ml-py) and needs nothing else but python3's standard library. The wrapper starts
it before the task and stops it (SIGTERM) after.

    python3 orbit_nvml.py --out artifacts/nvml-audit.jsonl [--interval 1.0] [--max-samples N]

Each tick, for each GPU, one line:

    {"ts", "index", "uuid", "name", "util_gpu", "util_mem", "mem_used_mib", "mem_total_mib",
     "temp_c", "power_w", "sm_clock_mhz", "mem_clock_mhz", "ecc_volatile_uncorrected", "xid"}

Each minute, for each GPU that was read in it, one line in nvml-minutes.jsonl beside --out
(what a chart of a day-long run draws, where the per-second file is too long to read whole):

    {"ts" (the minute's start), "index", "name", "samples", "util_gpu" (mean), "util_mem"
     (mean), "mem_used_mib" (max), "power_w" (mean), "temp_c" (max), "xid" (the last non-zero)}

A field NVML answers NOT_SUPPORTED for is null. "xid" is null where the device takes no XID
event registration, else the latest XID (critical error) seen since the last tick, or 0 for
none. A GPU whose readings fail (fallen off the bus) gets {"ts", "index", "uuid", "name",
"error", "nvml_error"} that tick, and the others go on. Without pynvml, the NVML library, a
driver or any GPU, it appends one {"ts", "nvml": "unavailable", "reason"} line and exits 0.
Ticks keep a fixed schedule (time.monotonic): a slow tick skips the ticks it overran, it
never drifts. SIGTERM or SIGINT ends the current tick, then NVML is shut down. Only the
calls above are made: never a process-listing one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import select
import signal
import sys
import time
from typing import Any

MIB = 1024 * 1024
MAX_EVENTS_PER_TICK = 64


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def num(value: Any, scale: int = 1) -> int | None:
    return None if value is None else int(value) // scale


class Device:
    def __init__(self, index: int) -> None:
        self.index = index
        self.handle: Any = None
        self.uuid: str | None = None
        self.name: str | None = None
        self.xid_supported = False
        self.init_error: Exception | None = None  # its handle could not be had


class Auditor:
    """Reads NVML through `nvml` (the pynvml module or anything shaped like it)."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.devices: list[Device] = []
        self.events: Any = None

    def optional(self, fn: Any, *args: Any) -> Any:
        """The call's answer, or None where NVML says NOT_SUPPORTED."""
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            if getattr(exc, "value", None) == self.nvml.NVML_ERROR_NOT_SUPPORTED:
                return None
            raise

    def open(self) -> str | None:
        """Initialise NVML and fetch every handle once. Returns why NVML is unusable, or None."""
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:
            return f"nvmlInit failed: {exc}"
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            self.close()
            return f"nvmlDeviceGetCount failed: {exc}"
        if count == 0:
            self.close()
            return "no GPU: nvmlDeviceGetCount() == 0"
        try:
            self.events = nvml.nvmlEventSetCreate()
        except Exception:
            self.events = None
        for index in range(count):
            dev = Device(index)
            try:
                dev.handle = nvml.nvmlDeviceGetHandleByIndex(index)
                dev.uuid = text(self.optional(nvml.nvmlDeviceGetUUID, dev.handle))
                dev.name = text(self.optional(nvml.nvmlDeviceGetName, dev.handle))
            except Exception as exc:
                dev.init_error = exc
            if self.events is not None and dev.init_error is None:
                try:
                    xid_type = nvml.nvmlEventTypeXidCriticalError
                    nvml.nvmlDeviceRegisterEvents(dev.handle, xid_type, self.events)
                    dev.xid_supported = True
                except Exception:
                    dev.xid_supported = False
            self.devices.append(dev)
        return None

    def close(self) -> None:
        if self.events is not None:
            try:
                self.nvml.nvmlEventSetFree(self.events)
            except Exception:
                pass
            self.events = None
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass

    def drain_xids(self) -> dict[int, int]:
        """The latest XID per device index since the last call (event waits of 0 ms)."""
        latest: dict[int, int] = {}
        if self.events is None:
            return latest
        nvml = self.nvml
        for _ in range(MAX_EVENTS_PER_TICK):
            try:
                event = nvml.nvmlEventSetWait(self.events, 0)
            except Exception:  # NVML_ERROR_TIMEOUT: nothing (more) pending
                break
            if not int(event.eventType) & int(nvml.nvmlEventTypeXidCriticalError):
                continue
            try:
                latest[int(nvml.nvmlDeviceGetIndex(event.device))] = int(event.eventData)
            except Exception:
                pass
        return latest

    def sample(self, dev: Device, ts: str, xids: dict[int, int]) -> dict[str, Any]:
        """One GPU's line. Raises if the GPU cannot be read at all."""
        if dev.init_error is not None:
            raise dev.init_error
        nvml, h, opt = self.nvml, dev.handle, self.optional
        util = opt(nvml.nvmlDeviceGetUtilizationRates, h)
        mem = opt(nvml.nvmlDeviceGetMemoryInfo, h)
        power_mw = opt(nvml.nvmlDeviceGetPowerUsage, h)
        return {
            "ts": ts,
            "index": dev.index,
            "uuid": dev.uuid,
            "name": dev.name,
            "util_gpu": None if util is None else num(util.gpu),
            "util_mem": None if util is None else num(util.memory),
            "mem_used_mib": None if mem is None else num(mem.used, MIB),
            "mem_total_mib": None if mem is None else num(mem.total, MIB),
            "temp_c": num(opt(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)),
            "power_w": None if power_mw is None else round(int(power_mw) / 1000.0, 3),
            "sm_clock_mhz": num(opt(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)),
            "mem_clock_mhz": num(opt(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM)),
            "ecc_volatile_uncorrected": num(
                opt(
                    nvml.nvmlDeviceGetTotalEccErrors,
                    h,
                    nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    nvml.NVML_VOLATILE_ECC,
                )
            ),
            "xid": xids.get(dev.index, 0) if dev.xid_supported else None,
        }

    def records(self) -> list[dict[str, Any]]:
        """Every GPU's record for one tick."""
        ts = now()
        xids = self.drain_xids()
        records = []
        for dev in self.devices:
            try:
                record = self.sample(dev, ts, xids)
            except Exception as exc:
                record = {"ts": ts, "index": dev.index, "uuid": dev.uuid, "name": dev.name}
                record["error"] = f"{type(exc).__name__}: {exc}"
                record["nvml_error"] = getattr(exc, "value", None)
            records.append(record)
        return records

    def tick(self) -> str:
        """Every GPU's line for one tick, newline-terminated."""
        return lines_of(self.records())


def lines_of(records: list[dict[str, Any]]) -> str:
    """The audit's lines of one tick's records."""
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)


MEAN = ("util_gpu", "util_mem", "power_w")
PEAK = ("mem_used_mib", "temp_c")


class Minutes:
    """Each GPU's samples of the current minute, summed up into one line when it is over."""

    def __init__(self) -> None:
        self.minute: str | None = None
        self.gpus: dict[int, dict[str, Any]] = {}

    def add(self, records: list[dict[str, Any]]) -> str:
        """Take one tick's records; the lines of the minute it ended, if it ended one."""
        done = ""
        for record in records:
            minute = str(record.get("ts", ""))[:16]  # 2026-11-29T08:14
            if minute != self.minute:
                done += self.flush()
                self.minute = minute
            if "error" in record:
                continue
            gpu = self.gpus.setdefault(record["index"], {"name": record.get("name"), "n": 0})
            gpu["n"] += 1
            for key in MEAN:
                if record.get(key) is not None:
                    gpu[key] = gpu.get(key, 0) + record[key]
                    gpu[key + "#"] = gpu.get(key + "#", 0) + 1
            for key in PEAK:
                if record.get(key) is not None:
                    gpu[key] = max(gpu.get(key, record[key]), record[key])
            if record.get("xid"):
                gpu["xid"] = record["xid"]
        return done

    def flush(self) -> str:
        """The current minute's lines (nothing when no GPU was read in it)."""
        lines = []
        for index, gpu in sorted(self.gpus.items()):
            line: dict[str, Any] = {
                "ts": f"{self.minute}:00.000+00:00",
                "index": index,
                "name": gpu["name"],
                "samples": gpu["n"],
                "xid": gpu.get("xid", 0),
            }
            for key in MEAN:
                count = gpu.get(key + "#")
                line[key] = round(gpu[key] / count, 3) if count else None
            for key in PEAK:
                line[key] = gpu.get(key)
            lines.append(json.dumps(line, sort_keys=True) + "\n")
        self.gpus = {}
        return "".join(lines)


class Stopper:
    """SIGTERM/SIGINT set `stop` and wake the sleep at once (through a pipe)."""

    def __init__(self) -> None:
        self.stop = False
        self.rfd, self.wfd = os.pipe()
        os.set_blocking(self.wfd, False)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.on_signal)

    def on_signal(self, _signum: int, _frame: Any) -> None:
        self.stop = True
        try:
            os.write(self.wfd, b"x")
        except OSError:
            pass

    def sleep(self, seconds: float) -> None:
        if seconds > 0 and not self.stop:
            select.select([self.rfd], [], [], seconds)


def load_nvml() -> Any:
    import pynvml  # the vendored scripts/pynvml.py (nvidia-ml-py)

    return pynvml


def run(out: str, interval: float, max_samples: int | None) -> int:
    stopper = Stopper()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    nofollow = getattr(os, "O_NOFOLLOW", 0)  # never through a link left in artifacts/

    def opener(path: str, flags: int) -> int:
        return os.open(path, flags | nofollow, 0o644)

    minutes_path = os.path.join(os.path.dirname(os.path.abspath(out)), "nvml-minutes.jsonl")
    with open(out, "a", encoding="utf-8", opener=opener) as f:
        try:
            auditor = Auditor(load_nvml())
            reason = auditor.open()
        except Exception as exc:  # ImportError, or a broken pynvml
            reason = f"pynvml unusable: {type(exc).__name__}: {exc}"
        if reason is not None:
            f.write(json.dumps({"ts": now(), "nvml": "unavailable", "reason": reason}) + "\n")
            return 0
        minutes = Minutes()
        with open(minutes_path, "a", encoding="utf-8", opener=opener) as per_minute:
            try:
                start, tick, written = time.monotonic(), 0, 0
                while not stopper.stop:
                    records = auditor.records()
                    f.write(lines_of(records))
                    f.flush()
                    ended = minutes.add(records)
                    if ended:
                        per_minute.write(ended)
                        per_minute.flush()
                    written += 1
                    if max_samples is not None and written >= max_samples:
                        break
                    tick += 1
                    current = time.monotonic()
                    if start + tick * interval < current:  # overran: skip to the next slot
                        tick = int((current - start) / interval) + 1
                    stopper.sleep(start + tick * interval - current)
            finally:
                auditor.close()
                per_minute.write(minutes.flush())  # the minute it stopped in, so far
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSONL file to append to")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between ticks")
    parser.add_argument("--max-samples", type=int, default=None, help="stop after N ticks")
    args = parser.parse_args(argv)
    if args.interval <= 0:
        parser.error("--interval must be > 0")
    return run(args.out, args.interval, args.max_samples)


if __name__ == "__main__":
    sys.exit(main())
