"""Launch modes: *how* a run is started, orthogonal to *where*. Pure.

A template's `launch_mode` is free-form YAML (`LaunchMode` allows extra keys) so that a
placement never needs to know about it. This module gives each known kind its typed settings
and checks them twice: when a template is read (a typo in a key names the file) and when a
request is resolved (a docker run must name its image). What it returns is normalized, with
every default filled in, because the launch mode is frozen into job.json: the settings that
ran are part of the bundle's identity, and the generated launch scripts are built from them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationError, field_validator

from orbit.model.errors import InvalidInput, describe_validation_error
from orbit.model.models import IMAGE_REF, LaunchMode, Record, Strict
from orbit.model.task import ShapedTask

HOST_PROCESS = "host_process"
DOCKER = "docker"
KNOWN_KINDS = (DOCKER, HOST_PROCESS)
# The shell of a shell-form command: bash on a host, where ORBIT's runtime needs it anyway; in a
# container /bin/sh, as Docker's own shell form, since many images (alpine, busybox) lack bash.
HOST_SHELL = ("bash", "-c")
CONTAINER_SHELL = ("/bin/sh", "-c")
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class Mount(Record):
    """A host folder the template lets into the container: `host:container[:ro|rw]`."""

    source: str
    target: str
    read_only: bool = False


def parse_mount(text: str) -> Mount:
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ValueError(f"'{text}' is not host:container[:ro|rw]")
    source, target = parts[0], parts[1]
    for path in (source, target):
        if not path.startswith("/") or "," in path or "\n" in path:
            raise ValueError(f"'{text}': both paths must be absolute, without commas")
    if target == "/orbit" or target.startswith("/orbit/"):
        raise ValueError(f"'{text}': /orbit is where ORBIT mounts the bundle")
    return Mount(source=source, target=target, read_only=len(parts) == 3 and parts[2] == "ro")


class DockerLaunch(Strict):
    """`launch_mode: {kind: docker, ...}`. GPUs are not set here: they follow the attempt's
    `resources.gpu_count` (and, where a scheduler assigns them, the exact devices)."""

    image: str | None = Field(default=None, pattern=IMAGE_REF)
    # missing: pull only when the host lacks the image (docker run's own rule); always: pull
    # every attempt (a moving tag); never: the image must be on the host already
    pull: Literal["missing", "always", "never"] = "missing"
    # host: the task shares the host's network, as a host process would (downloads, NCCL
    # across nodes, no port mapping); none: no network; or a docker network's name
    network: str = Field(default="host", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    # /dev/shm: Docker's 64 MB default breaks PyTorch DataLoader workers and NCCL; a tmpfs
    # costs memory only as it fills
    shm_size: str = Field(default="8g", pattern=r"^[0-9]+(\.[0-9]+)?[bkmgBKMG]?$")
    init: bool = True  # a tiny init as PID 1: forwards `docker stop`'s SIGTERM, reaps zombies
    # image: the image's own user (usually root); host: the wrapper's uid:gid, so files the
    # task writes into artifacts/ belong to whoever runs ORBIT
    user: Literal["image", "host"] = "image"
    mounts: tuple[str, ...] = ()  # host:container[:ro|rw], only what the template lists
    # names whose values pass from the wrapper's environment into the container when set
    # there (HF_TOKEN...): secrets reach the task without ever being frozen into a bundle
    env_passthrough: tuple[str, ...] = ()

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, mounts: tuple[str, ...]) -> tuple[str, ...]:
        for text in mounts:
            parse_mount(text)
        return mounts

    @field_validator("env_passthrough")
    @classmethod
    def _names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        import re

        for name in names:
            if not re.match(ENV_NAME, name):
                raise ValueError(f"'{name}' is not an environment variable name")
        return names

    def parsed_mounts(self) -> tuple[Mount, ...]:
        return tuple(parse_mount(text) for text in self.mounts)


class _InTemplate(Strict):
    """Only so that an error names its field as a user wrote it: `launch_mode.shm_size`."""

    launch_mode: DockerLaunch


def _docker(mode: LaunchMode, source: str) -> DockerLaunch:
    try:
        data = {"launch_mode": mode.model_dump(exclude={"kind"})}
        return _InTemplate.model_validate(data).launch_mode
    except ValidationError as exc:
        raise InvalidInput(describe_validation_error(source, exc, _InTemplate)) from None


def check_launch_mode(mode: LaunchMode, source: str) -> None:
    """A template's launch mode, as read: a known kind, with known settings of the right type.
    The image may still be missing here: a submission can give it."""
    if mode.kind not in KNOWN_KINDS:
        raise InvalidInput(
            f"{source}: launch_mode.kind: '{mode.kind}' is not a launch mode "
            f"(known: {', '.join(KNOWN_KINDS)})"
        )
    if mode.kind == DOCKER:
        _docker(mode, source)
    elif mode.model_extra:
        raise InvalidInput(
            f"{source}: launch_mode.{sorted(mode.model_extra)[0]}: unknown key "
            f"(a {HOST_PROCESS} launch mode takes no settings)"
        )


def docker_settings(mode: LaunchMode) -> DockerLaunch:
    """The typed settings of a docker launch mode (already checked when it was resolved)."""
    if mode.kind != DOCKER:
        raise InvalidInput(f"launch_mode.kind: '{mode.kind}' is not {DOCKER}")
    return _docker(mode, "job")


def resolve_launch_mode(mode: LaunchMode, image: str | None, template_id: str) -> LaunchMode:
    """The template's launch mode with the submission's `image` laid over it, normalized.
    A docker run without an image is refused here, before anything is written."""
    check_launch_mode(mode, f"template '{template_id}'")
    if mode.kind != DOCKER:
        if image is not None:
            raise InvalidInput(
                f"launch_mode.image: template '{template_id}' runs a {mode.kind}, "
                "which takes no image"
            )
        return mode
    settings = _docker(mode, f"template '{template_id}'")
    if image is not None:
        try:
            settings = DockerLaunch.model_validate({**settings.model_dump(), "image": image})
        except ValidationError as exc:
            raise InvalidInput(describe_validation_error("overrides", exc)) from None
    if settings.image is None:
        raise InvalidInput(
            f"launch_mode.image: template '{template_id}' names no image; give one with "
            "--set image=REF (or `overrides: {image: REF}` in the spec)"
        )
    return LaunchMode.model_validate({"kind": DOCKER, **settings.model_dump(mode="json")})


def task_entrypoint(mode: LaunchMode, shaped: ShapedTask) -> tuple[str, ...]:
    """What job.json runs: the task's argv, or its shell-form command under the launch mode's
    shell. Only the launch mode decides, so the same submission gives the same bundle."""
    if shaped.shell_command is None:
        return shaped.entrypoint
    shell = CONTAINER_SHELL if mode.kind == DOCKER else HOST_SHELL
    return (*shell, shaped.shell_command)
