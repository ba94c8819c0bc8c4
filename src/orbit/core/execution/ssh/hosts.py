"""What `orbit hosts check` finds on an SSH host (the probe script and its parser), and the
pure check that refuses a request a host cannot serve. No I/O here."""

from __future__ import annotations

import re
from datetime import datetime

from orbit.model.errors import Refused
from orbit.model.hosts import GpuInfo, HostFacts, HostRecord
from orbit.model.models import ExecutionRequest

# How a machine's GPUs are listed, here and by `orbit` for this machine (one GpuInfo a line)
NVIDIA_SMI_QUERY = ("--query-gpu=index,name,memory.total,uuid", "--format=csv,noheader,nounits")

# Runs on the host with `sh -s -- WORK_DIR PYTHON`: POSIX sh only, so that it also reports a
# host without python3. One `key=value` per line; a GPU per `gpu=` line.
CHECK_SCRIPT = r"""
w="$1"; py="$2"
case "$w" in /*) ;; "~") w="$HOME" ;; "~/"*) w="$HOME/${w#"~/"}" ;; *) w="$HOME/$w" ;; esac
echo "work_dir=$w"
echo "kernel=$(uname -sr 2>/dev/null)"
[ -r /etc/os-release ] && (. /etc/os-release && echo "os=$PRETTY_NAME")
if p=$(command -v "$py" 2>/dev/null); then
  echo "python_path=$p"
  echo "python_version=$("$p" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>&1)"
fi
d="$w"; while [ ! -d "$d" ]; do d=$(dirname "$d"); done
echo "disk_free_kb=$(df -Pk "$d" 2>/dev/null | awk 'NR==2 {print $4}')"
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "nvidia_smi=1"
  nvidia-smi --query-gpu=index,name,memory.total,uuid --format=csv,noheader,nounits 2>/dev/null |
    sed 's/^/gpu=/'
fi
if command -v docker >/dev/null 2>&1; then
  v=$(docker version --format '{{.Server.Version}}' 2>/dev/null)
  echo "docker=${v:-client only}"
  # --gpus works with an nvidia runtime, or with NVIDIA's prestart hook alone
  { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q nvidia ||
    command -v nvidia-container-runtime-hook >/dev/null 2>&1; } && echo docker_nvidia=1
fi
command -v rsync >/dev/null 2>&1 && echo rsync=1
exit 0
"""


def _int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def parse_gpu(line: str) -> GpuInfo | None:
    """One line of `nvidia-smi --query-gpu=index,name,memory.total,uuid --format=csv,noheader,
    nounits`, e.g. `0, NVIDIA H100 80GB HBM3, 81559, GPU-...`."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < 2 or _int(parts[0]) is None:
        return None
    return GpuInfo(
        index=_int(parts[0]) or 0,
        name=parts[1],
        memory_mib=_int(parts[2]) if len(parts) > 2 else None,
        uuid=parts[3] if len(parts) > 3 and parts[3].startswith("GPU-") else None,
    )


def parse_facts(output: str, checked_at: datetime) -> HostFacts:
    values: dict[str, str] = {}
    gpus: list[GpuInfo] = []
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "gpu":
            gpu = parse_gpu(value)
            if gpu is not None:
                gpus.append(gpu)
        else:
            values[key] = value.strip()
    free_kb = _int(values.get("disk_free_kb", ""))
    version = values.get("python_version")
    return HostFacts(
        checked_at=checked_at,
        os=values.get("os") or None,
        kernel=values.get("kernel") or None,
        python_path=values.get("python_path") or None,
        python_version=version if version and re.fullmatch(r"\d+\.\d+\.\d+", version) else None,
        nvidia_smi="nvidia_smi" in values,
        gpus=tuple(gpus),
        work_dir=values.get("work_dir") or None,
        disk_free_bytes=None if free_kb is None else free_kb * 1024,
        docker=values.get("docker") or None,
        docker_nvidia="docker_nvidia" in values,
        rsync="rsync" in values,
    )


def check_request(host: HostRecord, request: ExecutionRequest) -> None:
    """Refuse, before anything is staged, what the host's last check says it cannot run."""
    facts = host.facts
    if facts is None:
        return  # never checked: staging will find out, and say so
    when = f"(orbit hosts check {host.name}, {facts.checked_at:%Y-%m-%d %H:%M} UTC)"
    if facts.python_path is None:
        raise Refused(
            f"host '{host.name}' has no {host.spec.python} {when}: the runtime wrapper needs "
            f"python3 there; install it, or point --python at one"
        )
    if not facts.rsync:
        raise Refused(f"host '{host.name}' has no rsync {when}: install it there")
    wanted = request.resources.gpu_count
    if wanted > len(facts.gpus):
        found = f"{len(facts.gpus)} GPU" + ("" if len(facts.gpus) == 1 else "s")
        raise Refused(
            f"host '{host.name}' reported {found} {when} and the request asks for {wanted}: "
            "lower resources.gpu_count or choose another target"
        )
    gpu_type = request.resources.gpu_type
    if wanted and gpu_type and not any(gpu_type.lower() in g.name.lower() for g in facts.gpus):
        names = ", ".join(sorted({g.name for g in facts.gpus}))
        raise Refused(
            f"host '{host.name}' has {names}, not {gpu_type} {when}: "
            "set resources.gpu_type or choose another target"
        )
    if request.launch_mode.kind == "docker":
        if facts.docker is None:
            raise Refused(f"host '{host.name}' has no docker {when}")
        if facts.docker == "client only":
            raise Refused(
                f"host '{host.name}' has the docker CLI but no daemon answered it {when}: start "
                "docker there (or add the login user to the docker group), then check again"
            )
        if wanted and not facts.docker_nvidia:
            raise Refused(
                f"host '{host.name}' has no NVIDIA container runtime {when}, and the request "
                f"asks for {wanted} GPU(s) inside a container"
            )
