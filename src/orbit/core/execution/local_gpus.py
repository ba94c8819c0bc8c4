"""This machine's GPUs, found as `orbit hosts check` finds an SSH host's (nvidia-smi), and the
check that refuses, before anything is written, a `local` request they cannot serve."""

from __future__ import annotations

import functools
import subprocess
from dataclasses import dataclass

from orbit.core.execution.ssh.hosts import NVIDIA_SMI_QUERY, parse_gpu
from orbit.model.errors import Refused
from orbit.model.hosts import GpuInfo
from orbit.model.models import ExecutionRequest

NVIDIA_SMI_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class LocalGpus:
    gpus: tuple[GpuInfo, ...]
    source: str  # how they were found, for messages: "nvidia-smi", "nvidia-smi: not found"


def query_gpus(nvidia_smi: str = "nvidia-smi") -> LocalGpus:
    argv = [nvidia_smi, *NVIDIA_SMI_QUERY]
    try:
        proc = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
        )
    except FileNotFoundError:
        return LocalGpus((), "nvidia-smi: not found")
    except OSError as exc:
        return LocalGpus((), f"nvidia-smi: {exc.strerror or exc}")
    except subprocess.TimeoutExpired:
        return LocalGpus((), f"nvidia-smi: no answer within {NVIDIA_SMI_TIMEOUT_S:.0f}s")
    if proc.returncode != 0:  # installed, but no driver answers it
        lines = [line.strip() for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
        detail = lines[-1][:200] if lines else "no message"
        return LocalGpus((), f"nvidia-smi: exit {proc.returncode}: {detail}")
    gpus = tuple(g for g in map(parse_gpu, proc.stdout.splitlines()) if g is not None)
    return LocalGpus(gpus, "nvidia-smi")


@functools.cache
def local_gpus() -> LocalGpus:
    """This machine's GPUs, asked once per process."""
    return query_gpus()


def check_local_gpus(request: ExecutionRequest, found: LocalGpus) -> None:
    """Refuse GPUs this machine does not have, with the figures. Pure; gpu_count 0 passes."""
    wanted = request.resources.gpu_count
    if wanted == 0:
        return
    have = len(found.gpus)
    if wanted > have:
        names = ", ".join(sorted({g.name for g in found.gpus}))
        source = f"{found.source}: {names}" if names else found.source
        raise Refused(
            f"resources.gpu_count: {wanted} requested, this machine has {have} "
            f"GPU{'' if have == 1 else 's'} ({source})"
        )
    gpu_type = request.resources.gpu_type
    if gpu_type and not any(gpu_type.lower() in g.name.lower() for g in found.gpus):
        names = ", ".join(sorted({g.name for g in found.gpus}))
        raise Refused(
            f"resources.gpu_type: {gpu_type} requested, this machine has {names} ({found.source})"
        )
