"""What `orbit clusters check` reads from Slurm: nodes (`sinfo --json` where the version has it,
else `scontrol -o show node`), partitions (`scontrol -o show partition`) and the version. The
parsers are pure; `probe` runs the commands."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from orbit.core.execution.slurm.shell import ClusterShell, slurm_message
from orbit.model.clusters import ClusterFacts, SlurmNode, SlurmPartition
from orbit.model.errors import OrbitError


def parse_gres(text: str) -> dict[str, int]:
    """`gpu:a100:2(S:0-1),gpu:v100:1,shard:8` -> {"a100": 2, "v100": 1}; `gpu:4` -> {"": 4}."""
    gpus: dict[str, int] = {}
    for item in re.sub(r"\([^)]*\)", "", text or "").split(","):
        parts = item.strip().split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        count = parts[-1]
        kind = parts[1] if len(parts) > 2 else ""
        if count.isdigit():
            gpus[kind] = gpus.get(kind, 0) + int(count)
    return gpus


def parse_duration(text: str) -> int | None:
    """Slurm's time limits: `UNLIMITED`/`infinite` -> None; `[D-]HH:MM:SS`, `MM:SS`, `MM`."""
    text = text.strip()
    if not text or text.upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A"):
        return None
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if len(parts) == 1:
        seconds = parts[0] * 60
    elif len(parts) == 2:
        seconds = (parts[0] * 60 + parts[1]) if not days else (parts[0] * 3600 + parts[1] * 60)
    else:
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return seconds + (int(days) * 86400 if days else 0)


def key_values(line: str) -> dict[str, str]:
    """One `scontrol -o` line: `Key=Value Key2=Value with spaces ...`."""
    found = {}
    for match in re.finditer(r"(\S+?)=(.*?)(?=\s+\S+?=|$)", line.strip()):
        found[match.group(1)] = match.group(2).strip()
    return found


def expand_hostlist(text: str) -> tuple[str, ...]:
    """`node[01-03,07],gpu1` -> node01, node02, node03, node07, gpu1."""
    names: list[str] = []
    for match in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", text or ""):
        stem, ranges = match.group(1), match.group(2)
        if not ranges:
            names.append(stem)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            for i in range(int(first), int(last or first) + 1):
                names.append(f"{stem}{i:0{len(first)}d}")
    return tuple(n for n in names if n and n != "(null)")


def parse_partitions(text: str) -> tuple[SlurmPartition, ...]:
    found = []
    for line in text.splitlines():
        kv = key_values(line)
        if "PartitionName" not in kv:
            continue
        accounts = kv.get("AllowAccounts", "ALL")
        found.append(
            SlurmPartition(
                name=kv["PartitionName"],
                state=kv.get("State", "UNKNOWN"),
                default=kv.get("Default") == "YES",
                nodes=expand_hostlist(kv.get("Nodes", "")),
                max_time_s=parse_duration(kv.get("MaxTime", "UNLIMITED")),
                allow_accounts=None if accounts == "ALL" else tuple(accounts.split(",")),
            )
        )
    return tuple(found)


def parse_nodes_json(text: str) -> tuple[SlurmNode, ...]:
    data: dict[str, Any] = json.loads(text)
    return tuple(
        SlurmNode(
            name=str(n["name"]),
            state=str(n.get("state", "unknown")).upper(),
            cpus=int(n.get("cpus") or 0),
            memory_mb=int(n.get("real_memory") or 0),
            gpus=parse_gres(str(n.get("gres") or "")),
            partitions=tuple(n.get("partitions") or ()),
        )
        for n in data.get("nodes", [])
    )


def parse_nodes_text(text: str) -> tuple[SlurmNode, ...]:
    found = []
    for line in text.splitlines():
        kv = key_values(line)
        if "NodeName" not in kv:
            continue
        found.append(
            SlurmNode(
                name=kv["NodeName"],
                state=kv.get("State", "UNKNOWN").split("+")[0],
                cpus=int(kv.get("CPUTot", "0") or 0),
                memory_mb=int(kv.get("RealMemory", "0") or 0),
                gpus=parse_gres(kv.get("Gres", "")),
                partitions=tuple(p for p in kv.get("Partitions", "").split(",") if p),
            )
        )
    return tuple(found)


def probe(shell: ClusterShell, work_dir: str) -> ClusterFacts:
    """Ask the cluster what it has now; also makes the work dir's layout there."""
    version = shell.output(["sinfo", "--version"]).split()[-1]
    nodes_json = shell.run(["sinfo", "--json"])
    if nodes_json.returncode == 0 and nodes_json.stdout.lstrip().startswith("{"):
        nodes, source = parse_nodes_json(nodes_json.stdout), "sinfo --json"
    else:  # before 21.08, or built without the JSON plugins
        nodes, source = (
            parse_nodes_text(shell.output(["scontrol", "-o", "show", "node"])),
            "scontrol",
        )
    partitions = parse_partitions(shell.output(["scontrol", "-o", "show", "partition"]))
    work = shell.hostside("stage-check", work_dir, "-")
    if shell.spec.docker_on_nodes:
        docker, docker_nvidia, where = node_docker_facts(shell)
    else:
        docker, docker_nvidia = docker_facts(shell)
        where = "the login node" if shell.ssh is not None else "this machine"
    return ClusterFacts(
        python_path=python_path(shell),
        docker=docker,
        docker_nvidia=docker_nvidia,
        docker_where=where,
        checked_at=datetime.now(UTC),
        version=version,
        source=source,
        partitions=partitions,
        nodes=nodes,
        work_dir=str(work["work"]) if "work" in work else None,
    )


DOCKER_PROBE = """
command -v docker >/dev/null 2>&1 || exit 0
v=$(docker version --format '{{.Server.Version}}' 2>/dev/null)
echo "docker=${v:-client only}"
# --gpus works with an nvidia runtime, or with NVIDIA's prestart hook alone
{ docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q nvidia ||
  command -v nvidia-container-runtime-hook >/dev/null 2>&1; } && echo docker_nvidia=1
exit 0
"""


def parse_docker(text: str) -> tuple[str | None, bool]:
    """DOCKER_PROBE's lines -> (the server's version, "client only" or None; NVIDIA runtime)."""
    values = dict(line.partition("=")[::2] for line in text.splitlines() if "=" in line)
    return values.get("docker") or None, "docker_nvidia" in values


def docker_facts(shell: ClusterShell) -> tuple[str | None, bool]:
    """Whether the docker CLI where the jobs are submitted reaches a daemon (what
    `slurm_docker` needs), as `orbit hosts check` asks an SSH host."""
    done = shell.run(["sh", "-c", DOCKER_PROBE])
    return parse_docker(done.stdout) if done.returncode == 0 else (None, False)


# how long the docker probe's job may wait for a node (srun --immediate)
NODE_PROBE_WAIT_S = 30


def node_docker_facts(shell: ClusterShell) -> tuple[str | None, bool, str]:
    """DOCKER_PROBE on a compute node of the cluster's partition: one short job (srun, one
    task, a minute at most), given NODE_PROBE_WAIT_S to start. Raises OrbitError, in one
    line with Slurm's reason, when it could not run."""
    spec = shell.spec
    argv = ["srun", f"--immediate={NODE_PROBE_WAIT_S}", "--nodes=1", "--ntasks=1", "--time=1"]
    argv += ["--job-name=orbit-docker-check"]
    argv += [f"--partition={spec.partition}"] if spec.partition else []
    argv += [f"--account={spec.account}"] if spec.account else []
    script = 'echo "node=$SLURMD_NODENAME"' + DOCKER_PROBE
    done = shell.run([*argv, "sh", "-c", script], timeout=NODE_PROBE_WAIT_S + 60)
    node = dict(line.partition("=")[::2] for line in done.stdout.splitlines()).get("node")
    if done.returncode != 0 or not node:
        raise OrbitError(
            f"{shell.where}: the docker probe's job (srun on "
            f"{spec.partition or 'the default partition'}) did not run: "
            f"{slurm_message(done.stderr) or f'exit {done.returncode}'}; check again when a node "
            "is free, or without --docker-on-nodes"
        )
    docker, nvidia = parse_docker(done.stdout)
    return docker, nvidia, f"node {node}"


def python_path(shell: ClusterShell) -> str | None:
    """The interpreter the cluster's python (a name, looked up on PATH) is: a version
    manager's shim in front of it (pyenv's is a bash script that runs pyenv) would be paid by
    every job's wrapper. None for a path given as such (it is what was meant)."""
    if "/" in shell.spec.python:
        return None
    done = shell.run([shell.spec.python, "-c", "import sys; print(sys.executable)"])
    path = done.stdout.strip()
    return path if done.returncode == 0 and path.startswith("/") else None
