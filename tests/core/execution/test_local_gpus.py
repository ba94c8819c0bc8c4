"""This machine's GPUs for the `local` placement: found with nvidia-smi as an SSH host's are,
and requests they cannot serve refused with the figures."""

from __future__ import annotations

import pytest

from orbit.core.execution.local_gpus import LocalGpus, check_local_gpus, query_gpus
from orbit.core.execution.ssh.hosts import CHECK_SCRIPT, NVIDIA_SMI_QUERY, parse_gpu
from orbit.model.errors import Refused
from orbit.model.models import ExecutionRequest, LaunchMode, Placement, Resources

# nvidia-smi's csv,noheader,nounits lines on a 2 x H100 box (as in tests/core/execution/ssh)
H100_LINES = (
    "0, NVIDIA H100 80GB HBM3, 81559, GPU-0f6c1b4e-6b8a-4c5e-9d3a-1b2c3d4e5f60",
    "1, NVIDIA H100 80GB HBM3, 81559, GPU-7a8b9c0d-1e2f-3a4b-5c6d-7e8f9a0b1c2d",
)
TWO_H100 = LocalGpus(tuple(g for g in map(parse_gpu, H100_LINES) if g), "nvidia-smi")
NONE = LocalGpus((), "nvidia-smi: not found")


def request(gpu_count: int, gpu_type: str | None = None) -> ExecutionRequest:
    return ExecutionRequest(
        template_id="local",
        placement=Placement(kind="local"),
        launch_mode=LaunchMode(kind="host_process"),
        target="localhost",
        detach=True,
        resources=Resources(gpu_count=gpu_count, gpu_type=gpu_type),
        runtime_env={},
        stop_grace_s=10,
    )


def refusal(wanted: ExecutionRequest, found: LocalGpus) -> str:
    with pytest.raises(Refused) as info:
        check_local_gpus(wanted, found)
    return str(info.value)


def test_no_gpu_asked_for_always_passes() -> None:
    check_local_gpus(request(0), NONE)
    check_local_gpus(request(0, "H100"), NONE)


def test_gpus_this_machine_lacks_are_refused_with_the_figures() -> None:
    assert refusal(request(1), NONE) == (
        "resources.gpu_count: 1 requested, this machine has 0 GPUs (nvidia-smi: not found)"
    )
    assert refusal(request(10_000), TWO_H100) == (
        "resources.gpu_count: 10000 requested, this machine has 2 GPUs "
        "(nvidia-smi: NVIDIA H100 80GB HBM3)"
    )
    assert refusal(request(1, "A100"), TWO_H100) == (
        "resources.gpu_type: A100 requested, this machine has NVIDIA H100 80GB HBM3 (nvidia-smi)"
    )
    check_local_gpus(request(2, "h100"), TWO_H100)


def test_nvidia_smi_missing_or_failing_means_no_gpu() -> None:
    assert query_gpus("/nonexistent/nvidia-smi") == NONE
    failing = query_gpus("false")  # installed, but no driver answers: exits non-zero
    assert failing.gpus == () and failing.source == "nvidia-smi: exit 1: no message"


def test_the_same_query_as_hosts_check() -> None:
    assert " ".join(NVIDIA_SMI_QUERY) in CHECK_SCRIPT
