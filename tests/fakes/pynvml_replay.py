"""A `pynvml` stand-in that replays an NVML recording (see tools/record_nvml.py for the format).

Tests copy this file as `pynvml.py` next to a copy of the sidecar script, so that the script's
`import pynvml` finds it first on sys.path; an `orbit agent` started by the tests finds it
through tests/fakes/nvml_shim/ on its PYTHONPATH. The recording is the JSON file named by the
environment variable ORBIT_NVML_RECORDING.

Answers: a call found in the recording's "setup" always gets that answer. Calls found in its
"samples" get, in turn, each sample's answer to the same (function, args), cycling through the
samples: the k-th call of nvmlDeviceGetPowerUsage on device 0 gets the power of sample
k % len(samples). A recorded {"error": code} raises NVMLError(code). An entry marked
"unknown" (the published output it was transcribed from did not show that value) is replayed
as NVML_ERROR_NOT_SUPPORTED, so it comes out as null and is never invented. A call the
recording has no answer for raises AssertionError.

Every process-listing function raises AssertionError: the sidecar must never call one. If
ORBIT_NVML_CALL_LOG names a file, each call's function name is appended to it, one per line.
"""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
nvmlEventTypeXidCriticalError = 0x0000000000000008
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 36  # as nvidia-ml-py 13 defines it; a GPU has fewer (an H100: 18)

_ERROR_NAMES = {
    value: name
    for name, value in list(globals().items())
    if name.startswith("NVML_ERROR_") and isinstance(value, int)
}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"{_ERROR_NAMES.get(self.value, 'NVML_ERROR')} ({self.value})"


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<replayed device {self.index}>"


class _EventSet:
    pass


def _load() -> tuple[dict[tuple[Any, ...], dict[str, Any]], dict[tuple[Any, ...], list[Any]]]:
    with open(os.environ["ORBIT_NVML_RECORDING"], encoding="utf-8") as f:
        recording = json.load(f)
    setup = {(c["fn"], *c.get("args", [])): c for c in recording.get("setup", [])}
    per_sample: dict[tuple[Any, ...], list[Any]] = {}
    for sample in recording.get("samples", []):
        for call in sample["calls"]:
            per_sample.setdefault((call["fn"], *call.get("args", [])), []).append(call)
    return setup, per_sample


_SETUP, _SAMPLES = _load()
_CALLS: dict[tuple[Any, ...], int] = {}
_CALL_LOG = os.environ.get("ORBIT_NVML_CALL_LOG")


def _log(fn: str) -> None:
    if _CALL_LOG:
        with open(_CALL_LOG, "a", encoding="utf-8") as f:
            f.write(fn + "\n")


def _answer(fn: str, *args: Any) -> Any:
    _log(fn)
    key = (fn, *args)
    if key in _SETUP:
        call = _SETUP[key]
    elif key in _SAMPLES:
        n = _CALLS.get(key, 0)
        _CALLS[key] = n + 1
        answers = _SAMPLES[key]
        call = answers[n % len(answers)]
    else:
        raise AssertionError(f"the recording has no answer for {fn}{args}")
    if "error" in call:
        raise NVMLError(int(call["error"]))
    if "unknown" in call:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return call.get("ret")


def _index(handle: Any) -> int:
    if not isinstance(handle, _Handle):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return handle.index


# --- what the sidecar calls ------------------------------------------------------------------


def nvmlInit() -> None:
    _answer("nvmlInit")


def nvmlShutdown() -> None:
    _log("nvmlShutdown")


def nvmlDeviceGetCount() -> int:
    return int(_answer("nvmlDeviceGetCount"))


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    _answer("nvmlDeviceGetHandleByIndex", index)
    return _Handle(index)


def nvmlDeviceGetIndex(handle: Any) -> int:
    _log("nvmlDeviceGetIndex")
    return _index(handle)


def nvmlDeviceGetUUID(handle: Any) -> str:
    return str(_answer("nvmlDeviceGetUUID", _index(handle)))


def nvmlDeviceGetName(handle: Any) -> str:
    return str(_answer("nvmlDeviceGetName", _index(handle)))


def nvmlDeviceGetUtilizationRates(handle: Any) -> SimpleNamespace:
    ret = _answer("nvmlDeviceGetUtilizationRates", _index(handle))
    return SimpleNamespace(gpu=ret["gpu"], memory=ret["memory"])


def nvmlDeviceGetMemoryInfo(handle: Any, version: Any = None) -> SimpleNamespace:
    ret = _answer("nvmlDeviceGetMemoryInfo", _index(handle))
    return SimpleNamespace(total=ret["total"], free=ret["free"], used=ret["used"])


def nvmlDeviceGetTemperature(handle: Any, sensor: int) -> int:
    return int(_answer("nvmlDeviceGetTemperature", _index(handle), sensor))


def nvmlDeviceGetPowerUsage(handle: Any) -> int:
    return int(_answer("nvmlDeviceGetPowerUsage", _index(handle)))


def nvmlDeviceGetClockInfo(handle: Any, clock_type: int) -> int:
    return int(_answer("nvmlDeviceGetClockInfo", _index(handle), clock_type))


def nvmlDeviceGetTotalEccErrors(handle: Any, error_type: int, counter_type: int) -> int:
    return int(_answer("nvmlDeviceGetTotalEccErrors", _index(handle), error_type, counter_type))


# --- what the agent's node info calls (orbit.agent.nodeinfo) ---------------------------------


def nvmlDeviceGetPciInfo(handle: Any) -> SimpleNamespace:
    ret = _answer("nvmlDeviceGetPciInfo", _index(handle))
    return SimpleNamespace(busId=ret["busId"])


def nvmlDeviceGetNvLinkState(handle: Any, link: int) -> int:
    return int(_answer("nvmlDeviceGetNvLinkState", _index(handle), link))


def nvmlDeviceGetNvLinkRemotePciInfo(handle: Any, link: int) -> SimpleNamespace:
    ret = _answer("nvmlDeviceGetNvLinkRemotePciInfo", _index(handle), link)
    return SimpleNamespace(busId=ret["busId"])


# --- events ----------------------------------------------------------------------------------


def nvmlEventSetCreate() -> _EventSet:
    _answer("nvmlEventSetCreate")
    return _EventSet()


def nvmlDeviceRegisterEvents(handle: Any, event_types: int, event_set: Any) -> None:
    _answer("nvmlDeviceRegisterEvents", _index(handle), event_types)


def nvmlEventSetWait(event_set: Any, timeout_ms: int) -> SimpleNamespace:
    try:
        ret = _answer("nvmlEventSetWait", timeout_ms)
    except NVMLError as exc:  # as NVML does: a timeout comes after the time asked for
        if exc.value == NVML_ERROR_TIMEOUT:
            time.sleep(timeout_ms / 1000)
        raise
    return SimpleNamespace(
        device=_Handle(ret["device"]), eventType=ret["eventType"], eventData=ret["eventData"]
    )


def nvmlEventSetFree(event_set: Any) -> None:
    _log("nvmlEventSetFree")


# --- what the sidecar must never call --------------------------------------------------------


def _forbidden(name: str) -> Any:
    def call(*_args: Any, **_kwargs: Any) -> Any:
        _log(name)
        raise AssertionError(f"process-listing NVML function called: {name}")

    call.__name__ = name
    return call


_PROCESS_LISTING = (
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses_v2",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetRunningProcessDetailList",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetProcessesUtilizationInfo",
    "nvmlDeviceGetVgpuProcessUtilization",
    "nvmlDeviceGetVgpuProcessesUtilizationInfo",
    "nvmlDeviceGetAccountingPids",
    "nvmlDeviceGetAccountingStats",
    "nvmlDeviceGetAccountingStats_v2",
    "nvmlSystemGetProcessName",
)
for _name in _PROCESS_LISTING:
    globals()[_name] = _forbidden(_name)
