"""How `orbit server` runs: where it listens, its store, its limits, its loops, its TLS. Read
from `--config FILE` (YAML) with the command line's flags on top."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from orbit.core.models import Strict

MiB = 1024 * 1024


class Limits(Strict):
    """The most a client may send. Anything larger is refused with 413, and nothing is kept."""

    body_bytes: int = Field(default=1 * MiB, gt=0, description="a JSON request body")
    upload_bytes: int = Field(
        default=512 * MiB, gt=0, description="a submission's gathered inputs, as sent"
    )
    inputs_bytes: int = Field(
        default=2048 * MiB, gt=0, description="a submission's inputs, unpacked"
    )
    inputs_files: int = Field(default=100_000, gt=0, description="files in a submission")
    agent_bytes: int = Field(
        default=72 * MiB,
        gt=0,
        description="an agent's report or file transfer (a pulled file in base64)",
    )


class NodeTimings(Strict):
    """Agent nodes: heartbeat interval, how long a silent node stays online, and how much
    longer until its attempts are lost and retried elsewhere (defaults: ORBIT_NODE_* or 5,
    30 and 15 seconds)."""

    heartbeat_s: float | None = Field(default=None, gt=0, le=3600)
    offline_after_s: float | None = Field(default=None, gt=0, le=86400)
    lost_grace_s: float | None = Field(default=None, ge=0, le=86400)


class ServerConfig(Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8470, ge=0, le=65535)
    database_url: str | None = None  # default: ORBIT_DATABASE_URL, else $ORBIT_HOME/orbit.db
    admin_token_file: Path | None = None  # default: $ORBIT_HOME/admin-token
    limits: Limits = Limits()
    reconcile_every_s: float = Field(
        default=1.0, gt=0, description="how often each active attempt is looked at"
    )
    reconcile_workers: int = Field(
        default=8, ge=1, le=256, description="attempts looked at side by side"
    )
    nodes: NodeTimings = NodeTimings()
    loops: bool = True  # off: the API only (runs move when a client looks, as embedded)
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_keyfile_password: str | None = None
    log_level: str = "info"


def load_config(path: Path | None) -> ServerConfig:
    from pydantic import ValidationError

    from orbit.core.errors import InvalidInput, describe_validation_error
    from orbit.core.yamlio import load_yaml_mapping

    if path is None:
        return ServerConfig()
    data = load_yaml_mapping(path)

    try:
        return ServerConfig.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput(describe_validation_error(str(path), exc)) from None
