"""The NVML audit sidecar, run as a real subprocess against replayed NVML recordings.

Each test copies the sidecar as orbit_nvml.py into a temp folder, next to the replay fake
copied as pynvml.py (the script's own folder is first on sys.path), exactly as a bundle's
scripts/ folder holds orbit_nvml.py next to the vendored pynvml.py.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from orbit.runtime import vendor

ROOT = Path(__file__).resolve().parents[2]
SIDECAR = ROOT / "src" / "orbit" / "runtime" / "nvml_audit.py"
FAKE = ROOT / "tests" / "fakes" / "pynvml_replay.py"
RECORDER = ROOT / "tools" / "record_nvml.py"
DATA = ROOT / "tests" / "data" / "nvml"
H100 = DATA / "h100-recording.json"
NO_DRIVER = DATA / "no-driver-recording.json"
PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
MIB = 1024 * 1024

PROCESS_LISTING = {
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetProcessesUtilizationInfo",
    "nvmlDeviceGetAccountingPids",
    "nvmlSystemGetProcessName",
}
GPU_FIELDS = {
    "ts",
    "index",
    "uuid",
    "name",
    "util_gpu",
    "util_mem",
    "mem_used_mib",
    "mem_total_mib",
    "temp_c",
    "power_w",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "ecc_volatile_uncorrected",
    "xid",
}


class Scripts:
    """A scripts/ folder: the sidecar, and (unless `fake` is False) the replay fake."""

    def __init__(self, folder: Path, fake: bool = True) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.script = folder / "orbit_nvml.py"
        shutil.copy(SIDECAR, self.script)
        if fake:
            shutil.copy(FAKE, folder / "pynvml.py")
        self.out = folder.parent / "artifacts" / "nvml-audit.jsonl"
        self.call_log = folder.parent / "calls.log"

    def env(self, recording: Path | None) -> dict[str, str]:
        env = {"PATH": "/usr/bin:/bin", "ORBIT_NVML_CALL_LOG": str(self.call_log)}
        if recording is not None:
            env["ORBIT_NVML_RECORDING"] = str(recording)
        return env

    def argv(self, interval: float, max_samples: int | None) -> list[str]:
        argv = [PYTHON, str(self.script), "--out", str(self.out), "--interval", str(interval)]
        return argv + ([] if max_samples is None else ["--max-samples", str(max_samples)])

    def run(
        self, recording: Path | None, interval: float = 0.05, max_samples: int | None = 3
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(interval, max_samples),
            env=self.env(recording),
            capture_output=True,
            text=True,
            timeout=15,
        )

    def start(self, recording: Path, interval: float) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(interval, None),
            env=self.env(recording),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def lines(self) -> list[dict[str, Any]]:
        text = self.out.read_text(encoding="utf-8")
        assert text.endswith("\n"), "the last line is incomplete"
        return [json.loads(line) for line in text.splitlines()]

    def calls(self) -> list[str]:
        if not self.call_log.exists():
            return []
        return self.call_log.read_text(encoding="utf-8").split()


@pytest.fixture
def scripts(tmp_path: Path) -> Scripts:
    return Scripts(tmp_path / "scripts")


def write_recording(path: Path, setup: list[dict[str, Any]], samples: list[list[Any]]) -> Path:
    recording = {
        "format": "orbit-nvml-recording/1",
        "source": "synthetic test case (not a real reading)",
        "setup": setup,
        "samples": [{"calls": calls} for calls in samples],
    }
    path.write_text(json.dumps(recording), encoding="utf-8")
    return path


def two_gpu_setup(events: bool) -> list[dict[str, Any]]:
    setup: list[dict[str, Any]] = [
        {"fn": "nvmlInit", "args": [], "ret": None},
        {"fn": "nvmlDeviceGetCount", "args": [], "ret": 2},
        {"fn": "nvmlEventSetCreate", "args": [], "ret": None}
        if events
        else {"fn": "nvmlEventSetCreate", "args": [], "error": 3},
    ]
    # node info's calls: GPU 0's link 0 reaches GPU 1, its link 1 is down, and it has no
    # link 2 (INVALID_ARGUMENT); GPU 1 has no NVLink at all (NOT_SUPPORTED)
    nvlinks: list[list[dict[str, Any]]] = [
        [
            {"fn": "nvmlDeviceGetNvLinkState", "args": [0, 0], "ret": 1},
            {"fn": "nvmlDeviceGetNvLinkRemotePciInfo", "args": [0, 0], "ret": {"busId": BUS[1]}},
            {"fn": "nvmlDeviceGetNvLinkState", "args": [0, 1], "ret": 0},
            {"fn": "nvmlDeviceGetNvLinkState", "args": [0, 2], "error": 2},
        ],
        [{"fn": "nvmlDeviceGetNvLinkState", "args": [1, 0], "error": 3}],
    ]
    for i in (0, 1):
        setup += [
            {"fn": "nvmlDeviceGetHandleByIndex", "args": [i], "ret": None},
            {"fn": "nvmlDeviceGetUUID", "args": [i], "ret": f"GPU-test-{i}"},
            {"fn": "nvmlDeviceGetName", "args": [i], "ret": "Test GPU"},
            {"fn": "nvmlDeviceRegisterEvents", "args": [i, 8], "ret": None},
            {"fn": "nvmlDeviceGetPciInfo", "args": [i], "ret": {"busId": BUS[i]}},
            *nvlinks[i],
        ]
    return setup


BUS = ("00000000:19:00.0", "00000000:3B:00.0")


def gpu_calls(i: int, power_mw: int | None = 100_000, lost: bool = False) -> list[Any]:
    def answer(fn: str, args: list[int], ret: Any) -> dict[str, Any]:
        if lost:
            return {"fn": fn, "args": args, "error": 15}  # NVML_ERROR_GPU_IS_LOST
        if ret is None:
            return {"fn": fn, "args": args, "error": 3}  # NVML_ERROR_NOT_SUPPORTED
        return {"fn": fn, "args": args, "ret": ret}

    return [
        answer("nvmlDeviceGetUtilizationRates", [i], {"gpu": 50 + i, "memory": 10 + i}),
        answer("nvmlDeviceGetMemoryInfo", [i], {"total": 1000 * MIB, "free": 0, "used": 10 * MIB}),
        answer("nvmlDeviceGetTemperature", [i, 0], 60 + i),
        answer("nvmlDeviceGetPowerUsage", [i], power_mw),
        answer("nvmlDeviceGetClockInfo", [i, 1], 1980),
        answer("nvmlDeviceGetClockInfo", [i, 2], 2619),
        answer("nvmlDeviceGetTotalEccErrors", [i, 1, 0], None if power_mw is None else 0),
    ]


def event(ret: dict[str, int]) -> dict[str, Any]:
    return {"fn": "nvmlEventSetWait", "args": [0], "ret": ret}


def no_event() -> dict[str, Any]:
    return {"fn": "nvmlEventSetWait", "args": [0], "error": 10}  # NVML_ERROR_TIMEOUT


def expected_lines(recording_path: Path, ticks: int) -> list[dict[str, Any]]:
    """What the sidecar should write for `ticks` ticks of a recording (ts and xid aside)."""
    recording = json.loads(recording_path.read_text(encoding="utf-8"))
    setup = {(c["fn"], *c["args"]): c for c in recording["setup"]}

    def ret(call: dict[str, Any] | None) -> Any:
        if call is None or "error" in call or "unknown" in call:
            return None
        return call["ret"]

    count = ret(setup[("nvmlDeviceGetCount",)])
    expected = []
    for tick in range(ticks):
        sample = recording["samples"][tick % len(recording["samples"])]
        answers = {(c["fn"], *c["args"]): c for c in sample["calls"]}
        for i in range(count):
            util = ret(answers[("nvmlDeviceGetUtilizationRates", i)]) or {}
            mem = ret(answers[("nvmlDeviceGetMemoryInfo", i)]) or {}
            power = ret(answers[("nvmlDeviceGetPowerUsage", i)])
            expected.append(
                {
                    "index": i,
                    "uuid": ret(setup[("nvmlDeviceGetUUID", i)]),
                    "name": ret(setup[("nvmlDeviceGetName", i)]),
                    "util_gpu": util.get("gpu"),
                    "util_mem": util.get("memory"),
                    "mem_used_mib": None if "used" not in mem else mem["used"] // MIB,
                    "mem_total_mib": None if "total" not in mem else mem["total"] // MIB,
                    "temp_c": ret(answers[("nvmlDeviceGetTemperature", i, 0)]),
                    "power_w": None if power is None else power / 1000,
                    "sm_clock_mhz": ret(answers[("nvmlDeviceGetClockInfo", i, 1)]),
                    "mem_clock_mhz": ret(answers[("nvmlDeviceGetClockInfo", i, 2)]),
                    "ecc_volatile_uncorrected": ret(
                        answers[("nvmlDeviceGetTotalEccErrors", i, 1, 0)]
                    ),
                }
            )
    return expected


def without(line: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in line.items() if k not in keys}


# --- the H100 recording ----------------------------------------------------------------------


def test_one_line_per_gpu_per_tick_with_the_recorded_values(scripts: Scripts) -> None:
    result = scripts.run(H100, interval=0.05, max_samples=4)
    assert result.returncode == 0, result.stderr
    lines = scripts.lines()
    assert len(lines) == 2 * 4
    assert all(set(line) == GPU_FIELDS for line in lines)
    assert [without(line, "ts", "xid") for line in lines] == expected_lines(H100, 4)
    # the published table's own numbers, GPU 0 then GPU 1, first snapshot then second
    assert [(x["util_gpu"], x["temp_c"], x["power_w"]) for x in lines[:4]] == [
        (2, 35, 134.0),
        (0, 30, 109.0),
        (0, 39, 145.0),
        (4, 32, 140.0),
    ]
    assert {(x["mem_used_mib"], x["mem_total_mib"], x["name"]) for x in lines} == {
        (72790, 81559, "NVIDIA H100 80GB HBM3")
    }
    # one timestamp per tick, shared by its GPUs, strictly increasing between ticks
    stamps = [line["ts"] for line in lines]
    assert stamps[0::2] == stamps[1::2]
    assert stamps[0::2] == sorted(set(stamps))
    assert all(s.endswith("+00:00") for s in stamps)


def test_each_minute_is_summed_up_per_gpu_from_the_per_second_lines(scripts: Scripts) -> None:
    """nvml-minutes.jsonl (what a day-long run's chart reads): per GPU per minute, the mean
    of utilization and power and the peak of memory and temperature of that minute's lines,
    and how many there were; the minute it stopped in is written as far as it went."""
    result = scripts.run(H100, interval=0.05, max_samples=6)
    assert result.returncode == 0, result.stderr
    seconds = scripts.lines()
    text = (scripts.out.parent / "nvml-minutes.jsonl").read_text(encoding="utf-8")
    minutes = [json.loads(line) for line in text.splitlines()]
    assert minutes and sum(m["samples"] for m in minutes) == len(seconds)
    for m in minutes:
        mine = [x for x in seconds if x["index"] == m["index"] and x["ts"][:16] == m["ts"][:16]]
        assert m["samples"] == len(mine) and m["ts"].endswith(":00.000+00:00")
        assert m["util_gpu"] == round(sum(x["util_gpu"] for x in mine) / len(mine), 3)
        assert m["power_w"] == round(sum(x["power_w"] for x in mine) / len(mine), 3)
        assert m["mem_used_mib"] == max(x["mem_used_mib"] for x in mine)
        assert m["temp_c"] == max(x["temp_c"] for x in mine)
        assert m["name"] == "NVIDIA H100 80GB HBM3"


def test_values_the_source_did_not_show_or_nvml_does_not_support_are_null(
    scripts: Scripts,
) -> None:
    assert scripts.run(H100, max_samples=2).returncode == 0
    for line in scripts.lines():
        # not printed by the published nvidia-smi table: replayed as NOT_SUPPORTED
        assert line["uuid"] is None
        assert line["util_mem"] is None
        assert line["sm_clock_mhz"] is None and line["mem_clock_mhz"] is None
        assert line["xid"] is None  # no event set: XID events unsupported
        assert line["ecc_volatile_uncorrected"] == 0


def test_never_calls_a_process_listing_function(scripts: Scripts) -> None:
    assert scripts.run(H100, max_samples=3).returncode == 0
    calls = scripts.calls()
    assert calls[0] == "nvmlInit" and calls[-1] == "nvmlShutdown"
    assert not PROCESS_LISTING & set(calls)
    assert not any("Process" in name or "Accounting" in name for name in calls)
    assert not any("error" in line for line in scripts.lines())


# --- no NVML -----------------------------------------------------------------------------------


def test_nvml_init_failure_writes_one_unavailable_line_and_exits_0(scripts: Scripts) -> None:
    started = time.monotonic()
    result = scripts.run(NO_DRIVER, interval=1.0, max_samples=None)
    assert time.monotonic() - started < 5
    assert result.returncode == 0, result.stderr
    (line,) = scripts.lines()
    assert line["nvml"] == "unavailable"
    assert "NVML_ERROR_LIBRARY_NOT_FOUND" in line["reason"]
    assert set(line) == {"ts", "nvml", "reason"}


def test_a_missing_pynvml_module_writes_the_unavailable_line(tmp_path: Path) -> None:
    bare = Scripts(tmp_path / "scripts", fake=False)
    result = bare.run(None, interval=1.0, max_samples=None)
    assert result.returncode == 0, result.stderr
    (line,) = bare.lines()
    assert line["nvml"] == "unavailable"
    assert "No module named 'pynvml'" in line["reason"]


def test_no_gpu_writes_the_unavailable_line(scripts: Scripts, tmp_path: Path) -> None:
    setup = [
        {"fn": "nvmlInit", "args": [], "ret": None},
        {"fn": "nvmlDeviceGetCount", "args": [], "ret": 0},
    ]
    recording = write_recording(tmp_path / "zero.json", setup, [])
    assert scripts.run(recording, max_samples=None).returncode == 0
    (line,) = scripts.lines()
    assert line["nvml"] == "unavailable" and "no GPU" in line["reason"]
    assert scripts.calls()[-1] == "nvmlShutdown"


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has NVML"
)
def test_the_vendored_pynvml_on_a_machine_without_nvml(tmp_path: Path) -> None:
    source = vendor.nvml_module_source()
    assert source is not None and b"def nvmlInit" in source
    real = Scripts(tmp_path / "scripts", fake=False)
    (real.folder / "pynvml.py").write_bytes(source)
    assert real.run(None, max_samples=None).returncode == 0
    (line,) = real.lines()
    assert line["nvml"] == "unavailable"
    assert "nvmlInit failed" in line["reason"]


def test_nvml_module_source_is_none_without_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert vendor.nvml_module_source() is None


# --- stopping, schedule ----------------------------------------------------------------------


def wait_for_lines(scripts: Scripts, count: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if scripts.out.exists() and scripts.out.read_text().count("\n") >= count:
            return
        time.sleep(0.01)
    raise AssertionError(f"fewer than {count} lines after {timeout}s")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_it_promptly_with_complete_lines(
    scripts: Scripts, sig: signal.Signals
) -> None:
    proc = scripts.start(H100, interval=0.05)
    try:
        wait_for_lines(scripts, 6)
        sent = time.monotonic()
        proc.send_signal(sig)
        assert proc.wait(timeout=5) == 0, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() - sent < 1.0
    finally:
        proc.kill()
        proc.wait()
    lines = scripts.lines()
    assert len(lines) % 2 == 0 and len(lines) >= 6  # whole ticks only
    assert all(set(line) == GPU_FIELDS for line in lines)
    assert scripts.calls()[-1] == "nvmlShutdown"


def test_sigterm_wakes_a_long_sleep_at_once(scripts: Scripts) -> None:
    proc = scripts.start(H100, interval=30.0)
    try:
        wait_for_lines(scripts, 2)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
        assert time.monotonic() - sent < 1.0
    finally:
        proc.kill()
        proc.wait()
    assert len(scripts.lines()) == 2


def test_ticks_keep_a_fixed_schedule(scripts: Scripts) -> None:
    from datetime import datetime

    assert scripts.run(H100, interval=0.05, max_samples=11).returncode == 0
    stamps = [datetime.fromisoformat(x["ts"]) for x in scripts.lines()[0::2]]
    elapsed = (stamps[-1] - stamps[0]).total_seconds()
    assert 0.45 <= elapsed < 0.8  # 10 intervals of 0.05 s, no accumulated drift


# --- failures while sampling: synthetic recordings -------------------------------------------


def test_not_supported_fields_are_null_and_the_loop_goes_on(
    scripts: Scripts, tmp_path: Path
) -> None:
    samples = [[*gpu_calls(0), *gpu_calls(1, power_mw=None)]]
    recording = write_recording(tmp_path / "ns.json", two_gpu_setup(events=False), samples)
    assert scripts.run(recording, max_samples=2).returncode == 0
    lines = scripts.lines()
    assert len(lines) == 4
    assert [(x["index"], x["power_w"], x["ecc_volatile_uncorrected"]) for x in lines] == [
        (0, 100.0, 0),
        (1, None, None),
        (0, 100.0, 0),
        (1, None, None),
    ]
    assert all(x["sm_clock_mhz"] == 1980 and x["mem_clock_mhz"] == 2619 for x in lines)
    assert [x["uuid"] for x in lines[:2]] == ["GPU-test-0", "GPU-test-1"]


def test_a_gpu_falling_off_the_bus_gets_an_error_line_and_the_others_go_on(
    scripts: Scripts, tmp_path: Path
) -> None:
    samples = [
        [*gpu_calls(0), *gpu_calls(1)],
        [*gpu_calls(0), *gpu_calls(1, lost=True)],
        [*gpu_calls(0), *gpu_calls(1, lost=True)],
    ]
    recording = write_recording(tmp_path / "lost.json", two_gpu_setup(events=False), samples)
    result = scripts.run(recording, max_samples=3)
    assert result.returncode == 0, result.stderr
    lines = scripts.lines()
    assert len(lines) == 6
    lost = lines[3]
    assert lost["index"] == 1 and lost["nvml_error"] == 15 and "GPU_IS_LOST" in lost["error"]
    assert lost["uuid"] == "GPU-test-1"
    assert set(lost) == {"ts", "index", "uuid", "name", "error", "nvml_error"}
    assert [line.get("nvml_error") for line in lines] == [None, None, None, 15, None, 15]
    assert [line.get("util_gpu") for line in lines[0::2]] == [50, 50, 50]  # GPU 0 goes on


def test_a_gpu_whose_handle_fails_at_start_gets_an_error_line_every_tick(
    scripts: Scripts, tmp_path: Path
) -> None:
    setup = two_gpu_setup(events=False)
    for call in setup:
        if call["fn"] == "nvmlDeviceGetHandleByIndex" and call["args"] == [1]:
            call.pop("ret")
            call["error"] = 15  # NVML_ERROR_GPU_IS_LOST
    recording = write_recording(tmp_path / "nohandle.json", setup, [[*gpu_calls(0)]])
    assert scripts.run(recording, max_samples=2).returncode == 0
    lines = scripts.lines()
    assert [(x["index"], x.get("nvml_error"), x["uuid"]) for x in lines] == [
        (0, None, "GPU-test-0"),
        (1, 15, None),
        (0, None, "GPU-test-0"),
        (1, 15, None),
    ]


def test_xid_events_are_reported_for_their_gpu_then_reset(scripts: Scripts, tmp_path: Path) -> None:
    xid79 = {"device": 1, "eventType": 8, "eventData": 79}
    samples = [
        [event(xid79), no_event(), *gpu_calls(0), *gpu_calls(1)],
        [no_event(), *gpu_calls(0), *gpu_calls(1)],
    ]
    recording = write_recording(tmp_path / "xid.json", two_gpu_setup(events=True), samples)
    assert scripts.run(recording, max_samples=2).returncode == 0
    assert [(x["index"], x["xid"]) for x in scripts.lines()] == [(0, 0), (1, 79), (0, 0), (1, 0)]


# --- the recorder writes what the fake replays -------------------------------------------------


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_recorder_reproduces_a_replayed_recording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    xid = {"device": 0, "eventType": 8, "eventData": 48}
    samples = [
        [event(xid), no_event(), *gpu_calls(0), *gpu_calls(1, power_mw=None)],
        [no_event(), *gpu_calls(0), *gpu_calls(1)],
    ]
    original = write_recording(tmp_path / "orig.json", two_gpu_setup(events=True), samples)
    monkeypatch.setenv("ORBIT_NVML_RECORDING", str(original))
    monkeypatch.delenv("ORBIT_NVML_CALL_LOG", raising=False)
    fake = load(FAKE, "pynvml_replay_for_recorder")
    recorder = load(RECORDER, "record_nvml_under_test")
    again = recorder.record(fake, samples=2, interval=0.0)

    def plain(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in c.items() if k != "error_name"} for c in calls]

    source = json.loads(original.read_text())
    assert plain(again["setup"]) == source["setup"]
    assert [plain(s["calls"]) for s in again["samples"]] == [s["calls"] for s in source["samples"]]
