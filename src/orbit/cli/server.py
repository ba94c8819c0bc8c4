"""`orbit server`: one control plane for a team, over HTTP."""

from __future__ import annotations

from pathlib import Path

import typer


def server(
    host: str | None = typer.Option(
        None, "--host", help="Address to listen on (default 127.0.0.1: this machine only)."
    ),
    port: int | None = typer.Option(None, "--port", "-p", help="Port (default 8470)."),
    database_url: str | None = typer.Option(
        None,
        "--database-url",
        metavar="URL",
        help="The store: sqlite:///path for a small team, postgresql://... for replicas "
        "(default: ORBIT_DATABASE_URL, else $ORBIT_HOME/orbit.db).",
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        "-c",
        metavar="FILE",
        help="YAML settings: host, port, database_url, admin_token_file, limits, "
        "reconcile_every_s, local_roles (default [admin]: who may use templates placed on "
        "this machine), auth_failures (burst, window_s, block_s, sources), "
        "min_free_disk_mb, database_pool_size (PostgreSQL connections at most, 20), "
        "storage (retention rules, gc_every_s), ssl_certfile, "
        "ssl_keyfile... (flags win over it).",
    ),
    admin_token_file: Path | None = typer.Option(
        None,
        "--admin-token-file",
        metavar="PATH",
        help="Where the first start on an empty store writes the admin's token (mode 0600; "
        "default $ORBIT_HOME/admin-token).",
    ),
    ssl_certfile: Path | None = typer.Option(
        None, "--ssl-certfile", metavar="PEM", help="Serve HTTPS with this certificate."
    ),
    ssl_keyfile: Path | None = typer.Option(
        None, "--ssl-keyfile", metavar="PEM", help="... and this private key."
    ),
    no_loops: bool = typer.Option(
        False,
        "--no-loops",
        help="Serve the API only: runs then move only when a client looks (as embedded).",
    ),
) -> None:
    """Run the ORBIT server: the API (/api/v1, /openapi.json), /healthz and /metrics, and the
    loops that drive runs with nobody looking.

    \b
    Everyone's CLI talks to it with ORBIT_SERVER=URL and a token (ORBIT_TOKEN, or
    `orbit login URL`). On an empty store the first start creates the user `admin` and
    writes its token to $ORBIT_HOME/admin-token. Placements run from here: `local` is
    this machine (admins only, unless local_roles names members), and SSH hosts are
    reached with this machine's SSH configuration. What it keeps is its user's only
    (umask 077). Several replicas may serve one PostgreSQL store side by side.
    """
    from orbit.cli.common import settings
    from orbit.model.errors import InvalidInput
    from orbit.server.config import load_config
    from orbit.server.main import serve

    loaded = load_config(config)
    given = {
        "host": host,
        "port": port,
        "database_url": database_url,
        "admin_token_file": admin_token_file,
        "ssl_certfile": ssl_certfile,
        "ssl_keyfile": ssl_keyfile,
    }
    update = {k: v for k, v in given.items() if v is not None}
    if no_loops:
        update["loops"] = False
    final = loaded.model_copy(update=update)
    if (final.ssl_certfile is None) != (final.ssl_keyfile is None):
        raise InvalidInput("--ssl-certfile and --ssl-keyfile go together: give both or neither")
    for path in (final.ssl_certfile, final.ssl_keyfile):
        if path is not None and not path.is_file():
            raise InvalidInput(f"{path}: no such file")
    serve(settings(), final)
