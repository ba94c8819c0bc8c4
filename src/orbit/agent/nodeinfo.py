"""What this node has, as the agent reports it (orbit.agent.protocol.NodeInfo): accelerators
from NVML, CPUs, memory, free disk in the work dir, Docker and its NVIDIA runtime."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orbit import __version__
from orbit.agent.protocol import Accelerator, NodeInfo

MB = 1024 * 1024


def accelerators() -> tuple[tuple[Accelerator, ...], str]:
    try:
        import pynvml
    except ImportError:
        return (), "nvml: nvidia-ml-py not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no library, no driver: there are no GPUs to report
        return (), f"nvml: {exc}"
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            found.append(
                Accelerator(
                    index=index,
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    model=_text(pynvml.nvmlDeviceGetName(handle)),
                    memory_mb=int(memory.total) // MB,
                )
            )
        return tuple(found), "nvml"
    finally:
        pynvml.nvmlShutdown()


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
    return True, "nvidia" in proc.stdout


def memory_mb() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().total) // MB
    except Exception:
        return 0


def collect(work_dir: Path, models: Sequence[str] = (), datasets: Sequence[str] = ()) -> NodeInfo:
    gpus, source = accelerators()
    docker, nvidia = docker_facts()
    try:
        free = shutil.disk_usage(work_dir).free // (1024 * MB) * 1024  # whole GiB: no churn
    except OSError:
        free = 0
    return NodeInfo(
        agent_version=__version__,
        hostname=socket.gethostname(),
        accelerators=gpus,
        accelerator_source=source,
        cpus=len(os.sched_getaffinity(0)),
        memory_mb=memory_mb(),
        disk_free_mb=free,
        docker=docker,
        nvidia_runtime=nvidia,
        cached_models=tuple(models),
        cached_datasets=tuple(datasets),
    )
