"""What `orbit hosts check` reads from a host, and the refusals it makes possible. Pure."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from orbit.core.execution.ssh.hosts import check_request, parse_facts
from orbit.model.errors import Refused
from orbit.model.hosts import HostRecord, HostSpec
from orbit.model.models import ExecutionRequest, LaunchMode, Placement, Resources

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
# the check script's output on a 2 x H100 box (GPU lines in nvidia-smi's csv,noheader,nounits)
H100_BOX = """work_dir=/root/.orbit-work
kernel=Linux 5.15.0-105-generic
os=Ubuntu 22.04.4 LTS
python_path=/usr/bin/python3
python_version=3.10.12
disk_free_kb=1048576000
nvidia_smi=1
gpu=0, NVIDIA H100 80GB HBM3, 81559, GPU-0f6c1b4e-6b8a-4c5e-9d3a-1b2c3d4e5f60
gpu=1, NVIDIA H100 80GB HBM3, 81559, GPU-7a8b9c0d-1e2f-3a4b-5c6d-7e8f9a0b1c2d
docker=26.1.3
docker_nvidia=1
rsync=1
"""


def host(output: str) -> HostRecord:
    return HostRecord(
        spec=HostSpec(name="h100-a", ssh="root@203.0.113.7"),
        facts=parse_facts(output, NOW),
        created_at=NOW,
        created_by="tester",
    )


def request(
    gpus: int, gpu_type: str | None = "H100", launch: str = "host_process"
) -> ExecutionRequest:
    return ExecutionRequest(
        template_id="t",
        placement=Placement(kind="ssh"),
        launch_mode=LaunchMode(kind=launch),
        target="h100-a",
        detach=True,
        resources=Resources(gpu_type=gpu_type, gpu_count=gpus),
        runtime_env={},
        stop_grace_s=10,
    )


def test_the_check_output_of_a_gpu_box_is_read_in_full() -> None:
    facts = host(H100_BOX).facts
    assert facts is not None
    assert [g.name for g in facts.gpus] == ["NVIDIA H100 80GB HBM3"] * 2
    assert facts.gpus[1].index == 1 and facts.gpus[1].memory_mib == 81559
    assert facts.gpus[0].uuid and facts.gpus[0].uuid.startswith("GPU-0f6c")
    assert facts.python_version == "3.10.12" and facts.disk_free_bytes == 1048576000 * 1024
    assert facts.docker == "26.1.3" and facts.docker_nvidia and facts.rsync


def test_requests_the_host_cannot_serve_are_refused_with_the_reason() -> None:
    box = host(H100_BOX)
    check_request(box, request(2))
    check_request(box, request(2, launch="docker"))
    with pytest.raises(Refused, match=r"reported 2 GPUs .* asks for 4"):
        check_request(box, request(4))
    with pytest.raises(Refused, match=r"has NVIDIA H100 80GB HBM3, not A100"):
        check_request(box, request(1, gpu_type="A100"))
    bare = host(H100_BOX.replace("python_path=/usr/bin/python3\n", ""))
    with pytest.raises(Refused, match="has no python3"):
        check_request(bare, request(0))
    no_runtime = host(H100_BOX.replace("docker_nvidia=1\n", ""))
    check_request(no_runtime, request(1))  # a host process may use the GPUs
    with pytest.raises(Refused, match="no NVIDIA container runtime"):
        check_request(no_runtime, request(1, launch="docker"))
    no_daemon = host(H100_BOX.replace("docker=26.1.3", "docker=client only"))
    with pytest.raises(Refused, match="no daemon answered"):
        check_request(no_daemon, request(0, launch="docker"))


@pytest.mark.parametrize(
    ("field", "value"),
    [("name", "has space"), ("ssh", "-oProxyCommand=x"), ("proxy_jump", "-oX"), ("port", 0)],
)
def test_host_specs_refuse_what_ssh_would_misread(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        HostSpec.model_validate({"name": "h", "ssh": "root@h", field: value})
