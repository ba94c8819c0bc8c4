"""Starting `orbit server`: the control service over the configured store, the first admin on
an empty store, and uvicorn."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

from orbit.core.control.service import CoreControlService
from orbit.model.config import Settings
from orbit.model.private import PRIVATE_UMASK
from orbit.server.config import ServerConfig

log = logging.getLogger("orbit.server")


def server_settings(settings: Settings, config: ServerConfig) -> Settings:
    """The settings with the config file's store and node timings on top."""
    changes: dict[str, object] = {"database_pool_size": config.database_pool_size}
    if config.database_url:
        changes["database_url"] = config.database_url
    timings = config.nodes
    for field, value in (
        ("node_heartbeat_s", timings.heartbeat_s),
        ("node_offline_s", timings.offline_after_s),
        ("node_lost_grace_s", timings.lost_grace_s),
        ("node_fence", timings.fence),
    ):
        if value is not None:
            changes[field] = value
    return dataclasses.replace(settings, **changes)  # type: ignore[arg-type]


def open_service(settings: Settings, config: ServerConfig) -> CoreControlService:
    return CoreControlService.from_settings(
        settings,
        actor="orbit-server",
        live_templates=True,
        looks_on_read=not config.loops,  # the loops look; reads answer from the store
        retention=config.storage.retention,  # the server's rules, not storage.yaml
        secret_keys_file=config.secret_keys_file,
        max_sweep_points=config.limits.sweep_points,
    )


def bootstrap_admin(service: CoreControlService, token_file: Path) -> Path | None:
    """On an empty store: create the user `admin` and write its first token to `token_file`
    (0600), like k3s's node-token. The token reaches the file before the store and the file
    is named only once the store took it, so neither a crash nor a second replica starting at
    the same moment leaves a token that does not work. Returns the file when it wrote one."""
    from orbit.model.auth import new_token, token_hash

    if service.store.users.count_users() > 0:
        return None
    token = new_token()
    token_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = token_file.with_name(f".{token_file.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(token + "\n")
    try:
        created = service.store.users.bootstrap_admin(
            name="admin", token_hash=token_hash(token), actor="orbit-server"
        )
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if created is None:  # another replica was first
        tmp.unlink(missing_ok=True)
        return None
    os.replace(tmp, token_file)
    return token_file


def serve(settings: Settings, config: ServerConfig) -> None:
    import uvicorn

    from orbit.server.app import create_app

    # what the server writes (the store, bundles, attempts' files) is its user's only
    os.umask(PRIVATE_UMASK)
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)
    settings = server_settings(settings, config)
    service = open_service(settings, config)
    # the secrets' key set, made on a first start; a store sealed under keys it lacks is
    # refused now, in one line, rather than every run that uses a secret later
    service.check_secret_keys()
    token_file = config.admin_token_file or settings.home / "admin-token"
    written = bootstrap_admin(service, token_file)
    if written is not None:
        log.warning(
            "first start on an empty store: created the user 'admin'; its token is in %s "
            "(mode 0600). Read it once: `orbit login URL --token-file %s`",
            written,
            written,
        )
    app = create_app(service, config, settings)
    tls = config.ssl_certfile is not None
    log.info(
        "orbit server on %s://%s:%d, store %s",
        "https" if tls else "http",
        config.host,
        config.port,
        service.store.url.split("@")[-1],
    )
    log.info(
        "web console: %s://%s:%d/ui/ (sign in with a token, or run `orbit ui` for a link)",
        "https" if tls else "http",
        "127.0.0.1" if config.host in ("0.0.0.0", "::") else config.host,
        config.port,
    )
    uvicorn.run(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        access_log=False,
        ssl_certfile=str(config.ssl_certfile) if config.ssl_certfile else None,
        ssl_keyfile=str(config.ssl_keyfile) if config.ssl_keyfile else None,
        ssl_keyfile_password=config.ssl_keyfile_password,
        proxy_headers=True,
        timeout_graceful_shutdown=5,
        # agents and clients keep their connections between heartbeats (every 5 s by default)
        timeout_keep_alive=75,
    )
