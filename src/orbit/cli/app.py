"""`orbit`: submit ML jobs as frozen, reproducible runs; watch, cancel, retry and collect them.

State lives in $ORBIT_HOME (default ~/.orbit), or the database named by ORBIT_DATABASE_URL.
With ORBIT_SERVER=URL (or --server, or `orbit login URL`) every command talks to that
`orbit server` instead, shown ORBIT_TOKEN.
"""

from __future__ import annotations

import sys

import typer

from orbit.cli import (
    accounts,
    agent,
    alerts,
    audit,
    bulk,
    catalog,
    clusters,
    forensics,
    groups,
    hosts,
    logs,
    nodes,
    policy,
    runs,
    sched,
    sched_config,
    schema,
    secrets,
    server,
    storage,
)
from orbit.model.version import __version__

EXIT_CODES = (
    "Exit codes: 0 done; 1 what it looked at did not succeed (a --wait'ed run that failed, "
    "collect unverified, audit verify problems); 2 refused (bad input, unknown run, token "
    "or role, store unreachable); 3 a host, cluster or server did not answer; 130 "
    "interrupted."
)

app = typer.Typer(
    help=__doc__,
    epilog=EXIT_CODES,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,  # plain help: loading Rich for it would double the time --help takes
)
app.command()(runs.submit)
app.add_typer(catalog.templates_app, name="templates")
app.add_typer(catalog.experiments_app, name="experiments")
app.add_typer(runs.runs_app, name="runs")
app.add_typer(groups.groups_app, name="groups")
app.add_typer(hosts.hosts_app, name="hosts")
app.add_typer(clusters.clusters_app, name="clusters")
app.add_typer(nodes.nodes_app, name="nodes")
app.command()(sched.explain)
app.command()(sched.queue)
app.add_typer(sched.quotas_app, name="quotas")
app.add_typer(sched.sched_app, name="sched")
sched.sched_app.add_typer(sched_config.config_app, name="config")
app.command()(runs.status)
app.command()(logs.logs)
app.command()(bulk.cancel)
app.command()(bulk.retry)
app.command()(runs.replay)
app.command()(runs.collect)
app.command()(storage.gc)
app.command()(storage.usage)
app.add_typer(audit.audit_app, name="audit")
app.command("inspect")(forensics.inspect)
app.command("diff")(forensics.diff)
app.command()(server.server)
app.add_typer(agent.agent_app, name="agent")
app.command()(accounts.login)
app.command()(accounts.logout)
app.command()(accounts.whoami)
app.command()(accounts.ui)
app.add_typer(accounts.users_app, name="users")
app.add_typer(accounts.tokens_app, name="tokens")
app.add_typer(secrets.secrets_app, name="secrets")
app.add_typer(policy.policy_app, name="policy")
app.add_typer(alerts.alerts_app, name="alerts")
app.add_typer(schema.schema_app, name="schema")


def version_callback(value: bool) -> None:
    if value:
        print(f"orbit {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=version_callback, is_eager=True, help="Show the version."
    ),
    server_url: str | None = typer.Option(
        None,
        "--server",
        metavar="URL",
        help="Talk to this orbit server (default: ORBIT_SERVER, else what `orbit login` saved, "
        "else embedded: the store in this process).",
    ),
    no_progress: bool = typer.Option(
        False,
        "--no-progress",
        help="No transfer bars, even on a terminal (as ORBIT_NO_PROGRESS=1). They are drawn on "
        "standard error only where it is a terminal.",
    ),
) -> None:
    """Submit ML jobs as frozen, reproducible runs; watch, cancel, retry and collect them."""
    import os

    if server_url:
        os.environ["ORBIT_SERVER"] = server_url
    if no_progress:
        os.environ["ORBIT_NO_PROGRESS"] = "1"


def main() -> None:
    from orbit.model.errors import OrbitError, StoreError

    try:
        app()
    except OrbitError as exc:
        fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except OSError as exc:  # the disk or the system said no: say what, not where in ORBIT
        fail(f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}", 1)
    except StoreError as exc:  # the store cannot be reached or read
        from orbit.cli.common import settings

        url = settings().database_url
        fail(
            f"the store at {url} failed: {exc.first_line} (check ORBIT_DATABASE_URL / ORBIT_HOME)",
            2,
        )


def fail(message: str, code: int) -> None:
    from orbit.cli.common import err

    err.print(f"orbit: error: {message}")
    sys.exit(code)
