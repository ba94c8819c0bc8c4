"""SSH hosts as the control plane records them: how one is reached (HostSpec), what its last
check found (HostFacts) and the registry's record of both. Pure records."""

from __future__ import annotations

import re
from datetime import datetime

from pydantic import Field, field_validator

from orbit.model.models import NAME_PATTERN, Record, Strict


def registered_name(value: str) -> str:
    """A host's or a cluster's name (they share one name space): ValueError saying what is
    expected."""
    if not re.fullmatch(NAME_PATTERN, value):
        raise ValueError(
            "use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return value


class HostSpec(Strict):
    """A registered host. `ssh` is `user@address` or an alias from the user's ssh config, whose
    settings (port, key, proxy) keep working; the other fields override them when given."""

    name: str
    ssh: str
    port: int | None = Field(default=None, ge=1, le=65535)
    identity: str | None = None
    proxy_jump: str | None = None
    work_dir: str = Field(default=".orbit-work", min_length=1)  # relative: under the login's home
    python: str = Field(default="python3", min_length=1)
    unreachable_timeout_s: float = Field(default=600.0, ge=0)
    # trust a host key seen for the first time (never a changed one)
    accept_new_host_key: bool = False

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return registered_name(value)

    @field_validator("ssh")
    @classmethod
    def _destination(cls, value: str) -> str:
        # never an option in disguise (`-oProxyCommand=...`): ssh would obey it
        if not re.fullmatch(r"[^\s-][^\s]{0,254}", value):
            raise ValueError(
                "expected USER@ADDRESS or a Host alias from your ssh config (no spaces, not "
                "starting with '-')"
            )
        return value

    @field_validator("identity", "proxy_jump", "work_dir", "python")
    @classmethod
    def _no_whitespace(cls, value: str | None) -> str | None:
        if value is not None and re.search(r"\s", value):
            raise ValueError("must not contain whitespace")
        if value is not None and value.startswith("-"):
            raise ValueError("must not start with '-'")
        return value


class GpuInfo(Record):
    index: int
    name: str
    memory_mib: int | None = None
    uuid: str | None = None


class HostFacts(Record):
    """What `orbit hosts check` found, as of `checked_at`."""

    checked_at: datetime
    os: str | None = None
    kernel: str | None = None
    python_path: str | None = None
    python_version: str | None = None
    nvidia_smi: bool = False
    gpus: tuple[GpuInfo, ...] = ()
    work_dir: str | None = None  # absolute, on the host
    disk_free_bytes: int | None = None
    docker: str | None = None  # the server's version, or "client only"
    docker_nvidia: bool = False  # an NVIDIA container runtime is registered
    rsync: bool = False


class HostRecord(Record):
    spec: HostSpec
    facts: HostFacts | None = None
    created_at: datetime
    created_by: str

    @property
    def name(self) -> str:
        return self.spec.name
