"""A Docker host as the control plane sees it: what it can run, and which of ORBIT's containers
on it nobody recognizes any more.

Placement-agnostic: every function takes `run`, a callable that runs an argv where the Docker
CLI is (this machine: `local_runner`; an SSH host: the same argv over ssh) and returns
(exit code, stdout, stderr). The Docker host itself is the standard one of that environment:
DOCKER_HOST, or the default socket.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from orbit.core.execution.docker.scripts import (
    LABEL_ATTEMPT,
    LABEL_MANAGED,
    LABEL_NODE,
    LABEL_PLANE,
)
from orbit.model.errors import Refused
from orbit.model.launch_modes import docker_settings
from orbit.model.models import ExecutionRequest
from orbit.runtime.docker_launch import docker_endpoint as runtime_docker_endpoint

Runner = Callable[[list[str]], tuple[int, str, str]]
NVIDIA_HOOK = "nvidia-container-runtime-hook"  # what makes `--gpus` work without a runtime entry


def local_runner(argv: list[str], timeout: float = 60.0) -> tuple[int, str, str]:
    """Run an argv on this machine, in this environment (so with its DOCKER_HOST)."""
    try:
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: command not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{' '.join(argv[:3])}: no answer within {timeout:.0f}s"
    return proc.returncode, proc.stdout, proc.stderr


def docker_endpoint(env: Mapping[str, str] | None = None) -> str:
    """Where the Docker CLI goes, in words, for messages: DOCKER_HOST, else the default."""
    return runtime_docker_endpoint(os.environ if env is None else env)


def docker_is_local(env: Mapping[str, str] | None = None) -> bool:
    """Whether the Docker host is this machine: the default socket or another unix socket."""
    env = os.environ if env is None else env
    host = env.get("DOCKER_HOST") or ""
    return not env.get("DOCKER_CONTEXT") and (not host or host.startswith("unix://"))


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


@dataclass(frozen=True)
class DockerFacts:
    """What `docker info` says about a Docker host."""

    available: bool
    server_version: str | None = None
    runtimes: tuple[str, ...] = ()
    default_runtime: str | None = None
    nvidia: bool = False  # can `--gpus` work: an nvidia runtime, or NVIDIA's hook on the host
    error: str | None = None  # why it is not available

    def gpu_refusal(self) -> str | None:
        """Why a GPU request cannot run here, or None when it can."""
        if self.nvidia:
            return None
        runtimes = ", ".join(self.runtimes) or "none"
        return f"the Docker host has no NVIDIA container runtime (its runtimes: {runtimes})"


def docker_facts(run: Runner) -> DockerFacts:
    code, out, err = run(["docker", "info", "--format", "{{json .}}"])
    if code != 0:
        return DockerFacts(available=False, error=_last_line(err) or f"docker info exited {code}")
    try:
        info = json.loads(out)
    except ValueError:
        return DockerFacts(available=False, error="docker info printed no JSON")
    if not isinstance(info, dict) or not info.get("ServerVersion"):
        errors = info.get("ServerErrors") if isinstance(info, dict) else None
        return DockerFacts(available=False, error="; ".join(errors or ["no server answered"]))
    runtimes = tuple(sorted(info.get("Runtimes") or {}))
    nvidia = any("nvidia" in name for name in runtimes)
    if not nvidia:  # `--gpus` also works through NVIDIA's prestart hook alone
        hook, _, _ = run(["sh", "-c", f"command -v {NVIDIA_HOOK}"])
        nvidia = hook == 0
    return DockerFacts(
        available=True,
        server_version=str(info.get("ServerVersion")),
        runtimes=runtimes,
        default_runtime=info.get("DefaultRuntime"),
        nvidia=nvidia,
    )


def check_docker_request(request: ExecutionRequest, facts: DockerFacts, where: str) -> None:
    """What every placement refuses before launching a docker run: no image, no Docker, GPUs
    on a host that cannot give them to a container. `where` names the Docker host."""
    if not docker_settings(request.launch_mode).image:  # resolve() refuses this already
        raise Refused(f"launch_mode.image: the '{request.template_id}' request names no image")
    if not facts.available:
        raise Refused(f"docker is not reachable at {where}: {facts.error}")
    gpus = request.resources.gpu_count
    refusal = facts.gpu_refusal() if gpus > 0 else None
    if refusal is not None:
        raise Refused(
            f"resources.gpu_count={gpus}: {refusal}, so a container cannot be given GPUs "
            f"({where}); install the NVIDIA Container Toolkit there, or ask for no GPUs"
        )


def plane_id(work_dir: Path) -> str:
    """This control plane, as a label value: several ORBIT homes may share one Docker daemon,
    and a sweep by one must never remove another's containers. A random id made once and kept
    in the work dir (a path's hash would be the same on two laptops with the same user name);
    where it cannot be written, the path's hash."""
    path = work_dir / ".orbit-plane-id"
    try:
        return path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        pass
    except OSError:
        return hashlib.sha256(str(work_dir.resolve()).encode()).hexdigest()[:16]
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:  # another process made it first: theirs is the one
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return hashlib.sha256(str(work_dir.resolve()).encode()).hexdigest()[:16]
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(uuid.uuid4().hex[:16] + "\n")
    return path.read_text(encoding="utf-8").strip()


@dataclass(frozen=True)
class OrbitContainer:
    id: str
    name: str
    attempt_id: str
    node: str
    plane: str
    state: str  # running, exited, created...


@dataclass(frozen=True)
class SweepResult:
    removed: tuple[OrbitContainer, ...] = ()
    kept: tuple[OrbitContainer, ...] = ()
    errors: tuple[str, ...] = field(default_factory=tuple)


FORMAT = "\t".join(
    [
        "{{.ID}}",
        "{{.Names}}",
        f'{{{{.Label "{LABEL_ATTEMPT}"}}}}',
        f'{{{{.Label "{LABEL_NODE}"}}}}',
        f'{{{{.Label "{LABEL_PLANE}"}}}}',
        "{{.State}}",
    ]
)


def orbit_containers(run: Runner, plane: str | None = None) -> list[OrbitContainer]:
    """Every container labelled as ORBIT's, running or not; only the given control plane's
    when `plane` is given. Containers without ORBIT's label are never even listed."""
    argv = ["docker", "ps", "--all", "--no-trunc", "--filter", f"label={LABEL_MANAGED}"]
    if plane is not None:
        argv += ["--filter", f"label={LABEL_PLANE}={plane}"]
    code, out, err = run([*argv, "--format", FORMAT])
    if code != 0:
        raise RuntimeError(f"docker ps: {_last_line(err) or f'exited {code}'}")
    found = []
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 6:
            found.append(OrbitContainer(*parts))
    return found


def sweep_orphans(
    run: Runner, known_attempt_ids: Iterable[str], plane: str | None = None, grace_s: int = 10
) -> SweepResult:
    """Stop (gracefully, `grace_s`) and remove every ORBIT container whose attempt the control
    plane does not recognize: `known_attempt_ids` are the attempts it considers live on this
    host. A container without ORBIT's label is never touched; with `plane`, neither is one
    another control plane started."""
    known = set(known_attempt_ids)
    try:
        containers = orbit_containers(run, plane)
    except RuntimeError as exc:
        return SweepResult(errors=(str(exc),))
    orphans = [c for c in containers if c.attempt_id not in known]
    kept = tuple(c for c in containers if c.attempt_id in known)
    if not orphans:
        return SweepResult(kept=kept)
    ids = [c.id for c in orphans]
    errors = []
    running = [c.id for c in orphans if c.state in ("running", "paused", "restarting")]
    if running:
        code, _, err = run(["docker", "stop", "--time", str(grace_s), *running])
        if code != 0:
            errors.append(f"docker stop: {_last_line(err)}")
    code, _, err = run(["docker", "rm", "--force", *ids])
    if code != 0:
        errors.append(f"docker rm: {_last_line(err)}")
    return SweepResult(removed=tuple(orphans), kept=kept, errors=tuple(errors))


def remove_attempt_containers(run: Runner, attempt_id: str) -> list[str]:
    """Remove (at once) every container of one attempt, by its label: for an attempt whose
    wrapper is gone, which can no longer clean up after itself. The ids removed."""
    code, out, _ = run(
        ["docker", "ps", "--all", "--quiet", "--filter", f"label={LABEL_ATTEMPT}={attempt_id}"]
    )
    ids = out.split() if code == 0 else []
    if ids:
        run(["docker", "rm", "--force", *ids])
    return ids
