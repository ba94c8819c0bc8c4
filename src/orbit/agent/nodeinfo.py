"""What this node has, as the agent reports it (orbit.wire.protocol.NodeInfo): accelerators
from NVML, CPUs, memory, free disk in the work dir, Docker and its NVIDIA runtime."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orbit.model.version import __version__
from orbit.wire.protocol import Accelerator, NodeInfo

MB = 1024 * 1024


def accelerators() -> tuple[tuple[Accelerator, ...], str]:
    """This node's GPUs as NVML sees them, and how they were found (or why there are none)."""
    try:
        import pynvml
    except ImportError:
        return (), "nvml: nvidia-ml-py not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no library, no driver: there are no GPUs to report
        return (), f"nvml: {exc}"
    try:
        return _devices(pynvml)
    finally:
        pynvml.nvmlShutdown()


def utilization() -> dict[int, float]:
    """Each GPU's utilization (percent) as NVML measured it last; {} without NVML or GPUs, and
    a GPU that does not say is left out (a heartbeat must never fail for it)."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except Exception:
        return {}
    found: dict[int, float] = {}
    try:
        for index in range(int(pynvml.nvmlDeviceGetCount())):
            try:
                rates = pynvml.nvmlDeviceGetUtilizationRates(
                    pynvml.nvmlDeviceGetHandleByIndex(index)
                )
                found[index] = float(min(max(rates.gpu, 0), 100))
            except Exception:  # not supported there, or the GPU fell off the bus
                continue
    except Exception:
        return found
    finally:
        pynvml.nvmlShutdown()
    return found


def _devices(nvml: Any) -> tuple[tuple[Accelerator, ...], str]:
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as exc:
        return (), f"nvml: nvmlDeviceGetCount: {exc}"
    if count == 0:
        return (), "nvml: no GPU found"
    found: list[Accelerator] = []
    buses: dict[int, str] = {}  # index -> its own PCI bus id, where NVML tells
    remotes: dict[int, set[str]] = {}  # index -> PCI bus ids at the far end of its NVLinks
    skipped: list[str] = []
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_GPU_IS_LOST", -1):
                found.append(Accelerator(index=index, healthy=False, problem="off the bus"))
            skipped.append(f"GPU {index}: {exc}")
            continue
        uuid = _ask(nvml, nvml.nvmlDeviceGetUUID, handle)
        name = _ask(nvml, nvml.nvmlDeviceGetName, handle)
        memory = _ask(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
        pci = _ask(nvml, nvml.nvmlDeviceGetPciInfo, handle)
        if pci is not None and _bus_id(pci.busId):
            buses[index] = _bus_id(pci.busId)
        remotes[index] = _nvlink_remotes(nvml, handle)
        ecc = _ask(
            nvml,
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        found.append(
            Accelerator(
                index=index,
                uuid=_text(uuid) if uuid is not None else "",
                model=_text(name) if name is not None else "",
                memory_mb=int(memory.total or 0) // MB if memory is not None else 0,
                healthy=not ecc,
                problem=f"ecc {int(ecc)} uncorrected since reset" if ecc else "",
            )
        )
    peers = nvlink_peers(buses, remotes)
    gpus = tuple(g.model_copy(update={"nvlink_peers": peers.get(g.index, ())}) for g in found)
    return gpus, "nvml" + (f" ({'; '.join(skipped)})" if skipped else "")


def _ask(nvml: Any, fn: Any, *args: Any) -> Any:
    """NVML's answer, or None where it has none for this device (NOT_SUPPORTED and the like)."""
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


def _nvlink_remotes(nvml: Any, handle: Any) -> set[str]:
    """The PCI bus ids at the far end of this GPU's active NVLinks: other GPUs, or NVSwitches.
    Links are asked in turn until NVML says there are no more (NOT_SUPPORTED: no NVLink at all;
    INVALID_ARGUMENT: past the GPU's last link)."""
    stop = {nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT}
    found: set[str] = set()
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) in stop:
                break
            continue
        if state != nvml.NVML_FEATURE_ENABLED:
            continue
        remote = _ask(nvml, nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        if remote is not None and _bus_id(remote.busId):
            found.add(_bus_id(remote.busId))
    return found


def nvlink_peers(buses: dict[int, str], remotes: dict[int, set[str]]) -> dict[int, tuple[int, ...]]:
    """GPU index -> the indices it reaches over NVLink. Two GPUs are peers when a link of one
    ends at the other's PCI bus id (a direct link), or when links of both end at the same
    device that is not one of the GPUs (an NVSwitch: every GPU on it reaches every other)."""
    by_bus = {bus: index for index, bus in buses.items()}
    peers: dict[int, set[int]] = {index: set() for index in remotes}
    for index, ends in remotes.items():
        for end in ends:
            other = by_bus.get(end)
            if other is not None and other != index:
                peers[index].add(other)
                peers.setdefault(other, set()).add(index)
    switches: dict[str, set[int]] = {}
    for index, ends in remotes.items():
        for end in ends:
            if end not in by_bus:
                switches.setdefault(end, set()).add(index)
    for members in switches.values():
        for index in members:
            peers[index] |= members - {index}
    return {index: tuple(sorted(p)) for index, p in peers.items() if p}


def _bus_id(value: Any) -> str:
    """A PCI bus id in one spelling: NVML writes `00000000:3B:00.0`, older fields `0000:3b:00.0`."""
    text = _text(value).strip().lower()
    domain, _, rest = text.rpartition(":")
    domain, _, bus = domain.rpartition(":") if domain.count(":") else ("", "", domain)
    if not rest or not bus:
        return text
    try:
        return f"{int(domain or '0', 16):08x}:{int(bus, 16):02x}:{rest}"
    except ValueError:
        return text


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def docker_facts() -> tuple[bool, bool]:
    """Whether a Docker daemon answers, and whether it has the NVIDIA runtime."""
    if shutil.which("docker") is None:
        return False, False
    try:
        proc = subprocess.run(
            ["docker", "info", "--format", "{{json .Runtimes}}"],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return False, False
    if proc.returncode != 0:
        return False, False
    try:
        runtimes = json.loads(proc.stdout or "{}")
    except ValueError:
        runtimes = {}
    return True, isinstance(runtimes, dict) and "nvidia" in runtimes


def memory_mb() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().total) // MB
    except Exception:
        return 0


def with_faults(
    gpus: tuple[Accelerator, ...], faults: Mapping[int, str]
) -> tuple[Accelerator, ...]:
    """The GPUs, those with a fault seen since the agent started (an XID) marked unhealthy."""
    marked = []
    for gpu in gpus:
        fault = faults.get(gpu.index)
        if fault:
            problem = "; ".join(filter(None, (gpu.problem, fault)))
            gpu = gpu.model_copy(update={"healthy": False, "problem": problem[:200]})
        marked.append(gpu)
    return tuple(marked)


def collect(
    work_dir: Path,
    models: Sequence[str] = (),
    datasets: Sequence[str] = (),
    faults: Mapping[int, str] | None = None,
    services: Mapping[str, str] | None = None,
    address: str = "",
) -> NodeInfo:
    """The node's facts; `faults` are GPU faults seen meanwhile (orbit.agent.xids)."""
    gpus, source = accelerators()
    gpus = with_faults(gpus, faults or {})
    docker, nvidia = docker_facts()
    try:
        free = shutil.disk_usage(work_dir).free // (1024 * MB) * 1024  # whole GiB: no churn
    except OSError:
        free = 0
    return NodeInfo(
        agent_version=__version__,
        hostname=socket.gethostname(),
        address=address or socket.gethostname(),
        accelerators=gpus,
        accelerator_source=source,
        cpus=len(os.sched_getaffinity(0)),
        memory_mb=memory_mb(),
        disk_free_mb=free,
        docker=docker,
        nvidia_runtime=nvidia,
        cached_models=tuple(models),
        cached_datasets=tuple(datasets),
        services=dict(services or {}),
    )
