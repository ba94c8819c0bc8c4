#!/usr/bin/env python3
"""Record real NVML answers for replay in tests (tests/fakes/pynvml_replay.py).

Run it on a GPU machine, with nvidia-ml-py installed (`pip install nvidia-ml-py`):

    python3 tools/record_nvml.py --out tests/data/nvml/h200-recording.json [-n 10] [--interval 1]

It makes the calls the NVML audit sidecar (src/orbit/runtime/nvml_audit.py) makes, in the
same order, and those the agent's node info (src/orbit/agent/nodeinfo.py) adds: each GPU's PCI
bus id and its NVLinks. It writes every answer down. Without NVML (no library, no driver) the
recording holds nvmlInit's error and no samples: that is a recording too.

Format (JSON, "format": "orbit-nvml-recording/1"):

    {
      "format": "orbit-nvml-recording/1",
      "source": "where the answers come from (host and time, or a published output)",
      "recorded_at": "ISO 8601 UTC", "interval_s": 1.0,
      "meta": {"driver_version": "...", "nvml_version": "..."},     (information only)
      "setup": [CALL, ...],                  answered the same way every time they are made
      "samples": [{"ts": "ISO 8601 UTC", "calls": [CALL, ...]}, ...]   one per tick
    }

    CALL = {"fn": NAME, "args": ARGS, "ret": VALUE}
         | {"fn": NAME, "args": ARGS, "error": CODE, "error_name": "NVML_ERROR_..."}
         | {"fn": NAME, "args": ARGS, "unknown": WHY}      (hand transcriptions only: a value
                                                            the published source did not show)

ARGS is the call's arguments with a device handle written as its index (first) and the event
set left out: nvmlDeviceGetClockInfo(handle_of_0, NVML_CLOCK_SM) is
{"fn": "nvmlDeviceGetClockInfo", "args": [0, 1]}; nvmlEventSetWait(set, 0) is "args": [0].
VALUE is the plain answer (int, str), or for structures:

    nvmlDeviceGetUtilizationRates  {"gpu": %, "memory": %}
    nvmlDeviceGetMemoryInfo        {"total": bytes, "free": bytes, "used": bytes}
    nvmlEventSetWait               {"device": index, "eventType": int, "eventData": int (XID)}
    nvmlDeviceGetPciInfo           {"busId": "00000000:3B:00.0"}
    nvmlDeviceGetNvLinkRemotePciInfo  {"busId": ...}   (the device at the link's far end: a
                                   GPU, or an NVSwitch)

and null for calls that answer nothing (nvmlInit, nvmlDeviceGetHandleByIndex, ...). Setup
calls: nvmlInit, nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex, nvmlDeviceGetUUID,
nvmlDeviceGetName, nvmlEventSetCreate, nvmlDeviceRegisterEvents, nvmlDeviceGetPciInfo, then
nvmlDeviceGetNvLinkState(device, link) for link 0, 1, ... until NOT_SUPPORTED (no NVLink) or
INVALID_ARGUMENT (past the last link), with nvmlDeviceGetNvLinkRemotePciInfo(device, link) for
each link whose state is NVML_FEATURE_ENABLED. Sample calls, per tick:
nvmlEventSetWait(0 ms) until NVML_ERROR_TIMEOUT, then per device
nvmlDeviceGetUtilizationRates, nvmlDeviceGetMemoryInfo, nvmlDeviceGetTemperature(GPU),
nvmlDeviceGetPowerUsage (mW), nvmlDeviceGetClockInfo(SM), nvmlDeviceGetClockInfo(MEM),
nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE). No process-listing call is ever made.
"""

from __future__ import annotations

import argparse
import datetime
import json
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FORMAT = "orbit-nvml-recording/1"


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def error_name(nvml: Any, code: int) -> str:
    for name in dir(nvml):
        if name.startswith("NVML_ERROR_") and getattr(nvml, name) == code:
            return name
    return "NVML_ERROR_UNKNOWN"


def plain(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class Recorder:
    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml

    def call(
        self,
        calls: list[dict[str, Any]],
        fn: str,
        recorded_args: list[Any],
        *args: Any,
        encode: Callable[[Any], Any] = plain,
    ) -> tuple[bool, Any]:
        """Call nvml.`fn`(*args) and write it down in `calls`; returns (succeeded, answer)."""
        entry: dict[str, Any] = {"fn": fn, "args": recorded_args}
        try:
            raw = getattr(self.nvml, fn)(*args)
        except self.nvml.NVMLError as exc:
            entry["error"] = int(exc.value)
            entry["error_name"] = error_name(self.nvml, int(exc.value))
            calls.append(entry)
            return False, None
        entry["ret"] = encode(raw)
        calls.append(entry)
        return True, raw


def nothing(_value: Any) -> None:
    return None


def pci(info: Any) -> dict[str, Any]:
    return {"busId": plain(info.busId)}


def record_nvlinks(nvml: Any, rec: Recorder, setup: list[dict[str, Any]], i: int, h: Any) -> None:
    """The NVLink calls orbit.agent.nodeinfo makes for device `i`, in its order."""
    last = {nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT}
    for link in range(int(nvml.NVML_NVLINK_MAX_LINKS)):
        ok, state = rec.call(setup, "nvmlDeviceGetNvLinkState", [i, link], h, link)
        if not ok:
            if setup[-1]["error"] in last:
                break
            continue
        if state == nvml.NVML_FEATURE_ENABLED:
            rec.call(setup, "nvmlDeviceGetNvLinkRemotePciInfo", [i, link], h, link, encode=pci)


def record(nvml: Any, samples: int, interval: float) -> dict[str, Any]:
    rec = Recorder(nvml)
    out: dict[str, Any] = {
        "format": FORMAT,
        "source": f"recorded by tools/record_nvml.py on {socket.gethostname()}",
        "recorded_at": now(),
        "interval_s": interval,
        "meta": {},
        "setup": [],
        "samples": [],
    }
    setup = out["setup"]
    if not rec.call(setup, "nvmlInit", [], encode=nothing)[0]:
        return out
    try:
        for key, fn in (
            ("driver_version", "nvmlSystemGetDriverVersion"),
            ("nvml_version", "nvmlSystemGetNVMLVersion"),
        ):
            try:
                out["meta"][key] = plain(getattr(nvml, fn)())
            except Exception as exc:
                out["meta"][key] = f"unavailable: {exc}"
        ok, count = rec.call(setup, "nvmlDeviceGetCount", [])
        ok, events = rec.call(setup, "nvmlEventSetCreate", [], encode=nothing)
        xid = nvml.nvmlEventTypeXidCriticalError
        handles: dict[int, Any] = {}
        for i in range(int(count or 0)):
            ok, handle = rec.call(setup, "nvmlDeviceGetHandleByIndex", [i], i, encode=nothing)
            if not ok:
                continue
            handles[i] = handle
            rec.call(setup, "nvmlDeviceGetUUID", [i], handle)
            rec.call(setup, "nvmlDeviceGetName", [i], handle)
            if events is not None:
                rec.call(
                    setup, "nvmlDeviceRegisterEvents", [i, xid], handle, xid, events, encode=nothing
                )
            rec.call(setup, "nvmlDeviceGetPciInfo", [i], handle, encode=pci)
            record_nvlinks(nvml, rec, setup, i, handle)

        def event(e: Any) -> dict[str, int]:
            index = int(nvml.nvmlDeviceGetIndex(e.device))
            return {"device": index, "eventType": int(e.eventType), "eventData": int(e.eventData)}

        temp = nvml.NVML_TEMPERATURE_GPU
        sm, mem = nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM
        ecc = (nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)
        for n in range(samples):
            if n:
                time.sleep(interval)
            calls: list[dict[str, Any]] = []
            out["samples"].append({"ts": now(), "calls": calls})
            while events is not None:
                if not rec.call(calls, "nvmlEventSetWait", [0], events, 0, encode=event)[0]:
                    break  # NVML_ERROR_TIMEOUT: nothing (more) pending
            for i, h in handles.items():
                rec.call(
                    calls,
                    "nvmlDeviceGetUtilizationRates",
                    [i],
                    h,
                    encode=lambda u: {"gpu": int(u.gpu), "memory": int(u.memory)},
                )
                rec.call(
                    calls,
                    "nvmlDeviceGetMemoryInfo",
                    [i],
                    h,
                    encode=lambda m: {"total": m.total, "free": m.free, "used": m.used},
                )
                rec.call(calls, "nvmlDeviceGetTemperature", [i, temp], h, temp)
                rec.call(calls, "nvmlDeviceGetPowerUsage", [i], h)
                rec.call(calls, "nvmlDeviceGetClockInfo", [i, sm], h, sm)
                rec.call(calls, "nvmlDeviceGetClockInfo", [i, mem], h, mem)
                rec.call(calls, "nvmlDeviceGetTotalEccErrors", [i, *ecc], h, *ecc)
        if events is not None:
            nvml.nvmlEventSetFree(events)
    finally:
        nvml.nvmlShutdown()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="the JSON file to write")
    parser.add_argument("-n", "--samples", type=int, default=10, help="ticks to record")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between ticks")
    parser.add_argument("--source", help="overrides the recording's source text")
    args = parser.parse_args(argv)
    import pynvml  # nvidia-ml-py

    recording = record(pynvml, args.samples, args.interval)
    if args.source:
        recording["source"] = args.source
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(recording, indent=2) + "\n", encoding="utf-8")
    devices = sum(1 for c in recording["setup"] if c["fn"] == "nvmlDeviceGetHandleByIndex")
    print(f"{args.out}: {devices} device(s), {len(recording['samples'])} sample(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
