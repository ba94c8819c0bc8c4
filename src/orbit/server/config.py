"""How `orbit server` runs: where it listens, its store, its limits, its loops, its TLS. Read
from `--config FILE` (YAML) with the command line's flags on top."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationInfo, field_validator

from orbit.model.alerts import AlertsConfig
from orbit.model.auth import Role
from orbit.model.models import Strict
from orbit.model.permissions import Roles, SiteRole, check_site_roles
from orbit.model.retention import StorageConfig
from orbit.model.sweeps import MAX_POINTS

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
    sweep_points: int = Field(
        default=MAX_POINTS, gt=0, le=MAX_POINTS, description="runs one sweep may make"
    )
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
    # a node that has heard nothing from the server for offline_after_s + lost_grace_s stops
    # its attempts (default: ORBIT_NODE_FENCE, else true)
    fence: bool | None = None


class AuthFailures(Strict):
    """Failed authentications (a user's token, a node's credential) from one source address:
    after `burst` of them within `window_s`, every request from it is answered 429 for
    `block_s`, without a look at the store. At most `sources` addresses are remembered (the
    longest quiet ones are forgotten first); an IPv6 address counts by its /64, which one
    machine holds whole. A missing credential is counted, never held against an address."""

    burst: int = Field(default=20, ge=1, le=1_000_000)
    window_s: float = Field(default=60.0, gt=0, le=86400)
    block_s: float = Field(default=60.0, gt=0, le=86400)
    sources: int = Field(default=10_000, ge=1, le=10_000_000)


class ServerConfig(Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8470, ge=0, le=65535)
    database_url: str | None = None  # default: ORBIT_DATABASE_URL, else $ORBIT_HOME/orbit.db
    # PostgreSQL: at most this many connections per server process (psycopg_pool's bound); a
    # request finds one free within 30 s or is answered 503 with Retry-After. Replicas x this
    # must stay under the database's max_connections (100 by default)
    database_pool_size: int = Field(default=20, ge=2, le=1000)
    admin_token_file: Path | None = None  # default: $ORBIT_HOME/admin-token
    # the keys that seal secrets (orbit.model.secret_keys); default: ORBIT_SECRET_KEYS (the key
    # set itself), else ORBIT_SECRET_KEYS_FILE, else $ORBIT_HOME/secret-keys, made on first start
    secret_keys_file: Path | None = None
    limits: Limits = Limits()
    auth_failures: AuthFailures = AuthFailures()
    reconcile_every_s: float = Field(
        default=1.0, gt=0, description="how often each active attempt is looked at"
    )
    reconcile_workers: int = Field(
        default=8, ge=1, le=256, description="attempts looked at side by side"
    )
    # /healthz answers 503 when $ORBIT_HOME's disk (or the SQLite store's) has less free
    min_free_disk_mb: int = Field(default=64, ge=0, le=1_000_000)
    nodes: NodeTimings = NodeTimings()
    storage: StorageConfig = StorageConfig()  # retention rules and the gc loop's period
    alerts: AlertsConfig = AlertsConfig()  # thresholds and webhooks (orbit.server.alerts)
    loops: bool = True  # off: the API only (runs move when a client looks, as embedded)
    # roles of the site's own, beside admin, member and viewer: each a set of permissions
    # (orbit.model.permissions; `orbit users roles` lists them), from a built-in `base`
    roles: dict[str, SiteRole] = Field(default={}, max_length=100)
    # who may submit, replay or retry into a template that runs on this server's own host
    # (placement kind `local`): such a task can read what the server's user can
    local_roles: tuple[str, ...] = (Role.ADMIN.value,)
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_keyfile_password: str | None = None
    log_level: str = "info"

    _check_roles = field_validator("roles")(check_site_roles)

    @field_validator("local_roles")
    @classmethod
    def _admins_always(cls, roles: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        """An admin does everything; a viewer submits nothing anywhere; a role named is one
        this server knows (built in, or in `roles` above)."""
        known = Roles(info.data.get("roles"))
        for role in roles:
            if role == Role.VIEWER:
                raise ValueError("a viewer submits nothing: name admin and member only")
            if not known.known(role):
                raise ValueError(f"unknown role {role!r} (one of {', '.join(known.names())})")
        return tuple(dict.fromkeys((Role.ADMIN.value, *roles)))

    def known_roles(self) -> Roles:
        return Roles(self.roles)


def load_config(path: Path | None) -> ServerConfig:
    from pydantic import ValidationError

    from orbit.model.errors import InvalidInput, describe_validation_error
    from orbit.model.yamlio import load_yaml_mapping

    if path is None:
        return ServerConfig()
    data = load_yaml_mapping(path)

    try:
        return ServerConfig.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput(describe_validation_error(str(path), exc, ServerConfig)) from None
