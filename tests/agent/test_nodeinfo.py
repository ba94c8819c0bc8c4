"""What an agent reports about its node (orbit.agent.nodeinfo), its GPUs from NVML replayed from
recordings of real machines (tests/fakes/pynvml_replay.py, tests/data/nvml/): there is no GPU
here. Everything else (CPUs, memory, disk, Docker) is this machine's own."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from orbit.agent import nodeinfo
from orbit.wire.protocol import NodeInfo
from tests.dockerd import Dockerd

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fakes" / "pynvml_replay.py"
DATA = ROOT / "tests" / "data" / "nvml"
H100 = DATA / "h100-recording.json"
NVSWITCH = DATA / "h100-nvswitch-nvlink-recording.json"
NO_DRIVER = DATA / "no-driver-recording.json"
PROCESS_LISTING = ("Process", "Accounting")


def replay(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, recording: Path) -> Path:
    """`import pynvml` gets the replay of `recording` from here on; returns its call log."""
    calls = tmp_path / "nvml-calls.log"
    monkeypatch.setenv("ORBIT_NVML_RECORDING", str(recording))
    monkeypatch.setenv("ORBIT_NVML_CALL_LOG", str(calls))
    spec = importlib.util.spec_from_file_location("pynvml", FAKE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return calls


def write_recording(path: Path, setup: list[dict[str, Any]]) -> Path:
    recording = {"format": "orbit-nvml-recording/1", "source": "synthetic", "setup": setup}
    path.write_text(json.dumps(recording), encoding="utf-8")
    return path


def test_the_h100_recording_gives_two_h100s_with_their_memory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = replay(monkeypatch, tmp_path, H100)
    gpus, source = nodeinfo.accelerators()
    assert source == "nvml"
    assert [(g.index, g.model, g.memory_mb, g.vendor) for g in gpus] == [
        (0, "NVIDIA H100 80GB HBM3", 81559, "nvidia"),  # 81559MiB, as nvidia-smi printed it
        (1, "NVIDIA H100 80GB HBM3", 81559, "nvidia"),
    ]
    # the published table shows no UUID and no NVLink: replayed as NOT_SUPPORTED, reported empty
    assert all(g.uuid == "" and g.nvlink_peers == () for g in gpus)
    made = calls.read_text().split()
    assert made[0] == "nvmlInit" and made[-1] == "nvmlShutdown"
    assert "nvmlDeviceGetPciInfo" in made and "nvmlDeviceGetNvLinkState" in made
    assert "nvmlDeviceGetNvLinkRemotePciInfo" not in made  # no link reported active
    assert not any(word in name for name in made for word in PROCESS_LISTING)


def test_nvlinks_through_nvswitches_make_the_gpus_on_a_switch_peers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = replay(monkeypatch, tmp_path, NVSWITCH)
    gpus, source = nodeinfo.accelerators()
    assert source == "nvml"
    assert [(g.index, g.uuid, g.nvlink_peers) for g in gpus] == [
        (0, "GPU-257d8671-d0e6-d1a7-dea9-952249a668fa", (1,)),
        (1, "GPU-cc7d93b3-73f8-5028-287a-9e617839550e", (0,)),
    ]
    assert all(g.memory_mb == 0 for g in gpus)  # not in that output: unknown, not invented
    made = calls.read_text().split()
    # GPU 0: its 18 links, then link 18 answers NOT_SUPPORTED and the asking stops
    assert made.count("nvmlDeviceGetNvLinkState") == 19 + 3
    assert made.count("nvmlDeviceGetNvLinkRemotePciInfo") == 18 + 2


def test_no_nvml_library_is_zero_accelerators_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    replay(monkeypatch, tmp_path, NO_DRIVER)
    assert nodeinfo.accelerators() == ((), "nvml: NVML_ERROR_LIBRARY_NOT_FOUND (12)")
    info = nodeinfo.collect(tmp_path)
    assert info.accelerators == ()
    assert info.accelerator_source == "nvml: NVML_ERROR_LIBRARY_NOT_FOUND (12)"


def test_no_nvidia_ml_py_is_zero_accelerators_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    assert nodeinfo.accelerators() == ((), "nvml: nvidia-ml-py not installed")


def test_nvml_without_a_gpu_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    setup = [
        {"fn": "nvmlInit", "args": [], "ret": None},
        {"fn": "nvmlDeviceGetCount", "args": [], "ret": 0},
    ]
    calls = replay(monkeypatch, tmp_path, write_recording(tmp_path / "zero.json", setup))
    assert nodeinfo.accelerators() == ((), "nvml: no GPU found")
    assert calls.read_text().split()[-1] == "nvmlShutdown"


def test_the_rest_of_the_node_is_this_machine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    replay(monkeypatch, tmp_path, H100)
    monkeypatch.setenv("PATH", "/nonexistent")  # no docker CLI to be found
    info = nodeinfo.collect(tmp_path, models=("llama-3-8b",), datasets=("c4",))
    assert isinstance(info, NodeInfo)
    assert len(info.accelerators) == 2
    assert info.cpus == len(os.sched_getaffinity(0))
    assert info.memory_mb > 0 and info.disk_free_mb > 0 and info.disk_free_mb % 1024 == 0
    assert (info.docker, info.nvidia_runtime) == (False, False)
    assert (info.cached_models, info.cached_datasets) == (("llama-3-8b",), ("c4",))
    # what the agent sends is what the server reads back
    assert NodeInfo.model_validate_json(info.model_dump_json()) == info


def test_docker_facts_of_a_daemon_without_the_nvidia_runtime(
    dockerd: Dockerd, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", dockerd.host)
    assert nodeinfo.docker_facts() == (True, False)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{dockerd.root}/no-such.sock")
    assert nodeinfo.docker_facts() == (False, False)


# --- NVLink peers from bus ids (pure) ----------------------------------------------------------


def test_direct_links_map_to_the_gpu_at_the_far_end_whatever_the_bus_id_spelling() -> None:
    buses = {i: nodeinfo._bus_id(b) for i, b in enumerate(("0000:19:00.0", "00000000:3B:00.0"))}
    buses[2] = nodeinfo._bus_id("5d:00.0")
    remotes = {
        0: {nodeinfo._bus_id("00000000:3b:00.0")},
        1: {nodeinfo._bus_id("00000000:19:00.0")},
        2: set(),
    }
    assert nodeinfo.nvlink_peers(buses, remotes) == {0: (1,), 1: (0,)}


def test_a_switch_joins_every_gpu_on_it_and_only_those() -> None:
    buses = {0: "00000000:18:00.0", 1: "00000000:2a:00.0", 2: "00000000:3a:00.0"}
    switch_a, switch_b = "00000000:05:00.0", "00000000:06:00.0"
    remotes = {0: {switch_a}, 1: {switch_a, switch_b}, 2: {switch_b}}
    assert nodeinfo.nvlink_peers(buses, remotes) == {0: (1,), 1: (0, 2), 2: (1,)}


def test_an_xid_marks_its_gpu_unhealthy_and_one_the_application_caused_does_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from orbit.agent.xids import XidWatch
    from tests.agents import with_xids

    # GPU 0: xid 13 (a graphics engine exception: the task's own fault); GPU 1: xid 79 (fell
    # off the bus)
    waits: list[tuple[int, int] | None] = [None, (0, 13), (1, 79)]
    replay(monkeypatch, tmp_path, with_xids(H100, tmp_path / "xids.json", waits))
    told = threading.Event()
    watch = XidWatch(on_fault=told.set)
    watch.start()
    try:
        assert told.wait(10), "no fault seen"
        assert watch.faults() == {1: "xid 79"}
    finally:
        watch.close(timeout=5)
    info = nodeinfo.collect(tmp_path, faults=watch.faults())
    health = [(g.index, g.healthy, g.problem) for g in info.accelerators]
    assert health == [(0, True, ""), (1, False, "xid 79")]


def test_without_xid_events_nothing_is_watched_and_nothing_marked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from orbit.agent.xids import XidWatch

    calls = replay(monkeypatch, tmp_path, H100)  # the table shows no XID support
    watch = XidWatch()
    watch.start()
    watch.close(timeout=5)
    assert watch.faults() == {}
    made = calls.read_text().split()
    assert "nvmlEventSetCreate" in made and "nvmlEventSetWait" not in made
    assert made[-1] == "nvmlShutdown"
