"""`orbit agent`: run this machine as a node of an orbit server; it only ever connects out."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

agent_app = typer.Typer(no_args_is_help=False, invoke_without_command=True)

DEFAULT_WORK_DIR = Path("/var/lib/orbit-agent")


def _work_dir(given: Path | None) -> Path:
    if given is not None:
        return given.expanduser()
    if os.geteuid() == 0:
        return DEFAULT_WORK_DIR
    return Path("~/.orbit-agent").expanduser()


def _labels(text: str | None) -> dict[str, str]:
    from orbit.agent.protocol import parse_labels
    from orbit.core.errors import InvalidInput

    if not text:
        return {}
    try:
        return parse_labels(text)
    except ValueError as exc:
        raise InvalidInput(f"--labels: {exc}") from None


def _services(texts: list[str]) -> tuple[tuple[str, str], ...]:
    from orbit.agent.protocol import parse_service
    from orbit.core.errors import InvalidInput

    found: dict[str, str] = {}
    for text in texts:
        try:
            name, url = parse_service(text)
        except ValueError as exc:
            raise InvalidInput(f"--service: {exc}") from None
        if name in found:
            raise InvalidInput(f"--service: {name} given twice")
        found[name] = url
    return tuple(found.items())


SERVER = typer.Option(
    None,
    "--server",
    metavar="URL",
    help="The orbit server to connect to (https://... in production). Default: ORBIT_SERVER.",
)
JOIN = typer.Option(
    None,
    "--join-token",
    metavar="TOKEN",
    envvar="ORBIT_JOIN_TOKEN",
    help="Needed the first time only (`orbit nodes join-token create` makes one); the node "
    "credential it gets is kept in the work dir (mode 0600).",
)
NAME = typer.Option(None, "--name", help="The node's name (default: this host's short name).")
LABELS = typer.Option(
    None, "--labels", metavar="K=V,...", help="Labels pool templates select on, e.g. gpu=h100."
)
MAX_TASKS = typer.Option(
    1,
    "--max-tasks",
    min=0,
    help="Attempts run at once when joining (0: drain). Later: "
    "`orbit nodes set NODE --max-tasks N`.",
)
WORK_DIR = typer.Option(
    None,
    "--work-dir",
    metavar="DIR",
    help="Attempts, cached bundles and the node's credential (default /var/lib/orbit-agent as "
    "root, else ~/.orbit-agent). `orbit nodes push/pull` are confined to it.",
)
MODELS = typer.Option(
    None, "--model", metavar="NAME", help="A model cached on this node (repeat); reported."
)
DATASETS = typer.Option(
    None, "--dataset", metavar="NAME", help="A dataset cached on this node (repeat); reported."
)
SERVICES = typer.Option(
    None,
    "--service",
    metavar="NAME=URL",
    help="A model server running on this node (vLLM, a diffusion UI), e.g. "
    "vllm=http://127.0.0.1:8000 (repeat): `http` tasks asking for `service: NAME` are placed "
    "on a node that has it and sent to its URL.",
)
ADDRESS = typer.Option(
    None,
    "--address",
    metavar="HOST",
    help="Where the other nodes reach this one (an IP or a name they resolve; default: its "
    "hostname): a run across several nodes (num_nodes) meets at its rank 0's address.",
)
CA = typer.Option(
    None, "--ca-file", metavar="PEM", help="Trust this CA for the server's certificate."
)


@agent_app.callback()
def agent(
    ctx: typer.Context,
    server: str | None = SERVER,
    join_token: str | None = JOIN,
    name: str | None = NAME,
    labels: str | None = LABELS,
    max_tasks: int = MAX_TASKS,
    work_dir: Path | None = WORK_DIR,
    model: list[str] | None = MODELS,
    dataset: list[str] | None = DATASETS,
    service: list[str] | None = SERVICES,
    address: str | None = ADDRESS,
    ca_file: Path | None = CA,
) -> None:
    """Run this machine as a node: it registers once with a join token, then keeps a
    long-poll open to the server, runs the attempts placed on it, and streams their logs and
    files back. It listens on no port. Stop it with SIGTERM (systemctl stop): what it runs
    goes on, and a restarted agent picks it up again.

    \b
      orbit agent --server https://orbit.example:8470 --join-token orbitjoin_... \\
          --labels gpu=h100,rack=b2 --max-tasks 4
    """
    if ctx.invoked_subcommand is not None:
        return
    import logging
    import signal

    from orbit.agent.daemon import Agent, AgentOptions
    from orbit.core.errors import InvalidInput

    url = server or os.environ.get("ORBIT_SERVER")
    if not url:
        raise InvalidInput("--server: give the orbit server's URL (or set ORBIT_SERVER)")
    logging.basicConfig(
        level=os.environ.get("ORBIT_AGENT_LOG", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    options = AgentOptions(
        server=url,
        work_dir=_work_dir(work_dir),
        join_token=join_token,
        name=name,
        labels=_labels(labels),
        max_tasks=max_tasks,
        models=tuple(model or ()),
        datasets=tuple(dataset or ()),
        services=_services(service or []),
        address=address or "",
        verify=str(ca_file) if ca_file else True,
    )
    daemon = Agent(options)
    signal.signal(signal.SIGTERM, lambda *_: daemon.stop.set())
    signal.signal(signal.SIGINT, lambda *_: daemon.stop.set())
    sys.exit(daemon.run())


@agent_app.command("install-service")
def install_service(
    server: str | None = SERVER,
    join_token: str | None = JOIN,
    name: str | None = NAME,
    labels: str | None = LABELS,
    max_tasks: int = MAX_TASKS,
    work_dir: Path | None = WORK_DIR,
    unit: Path = typer.Option(
        Path("/etc/systemd/system/orbit-agent.service"),
        "--unit",
        metavar="PATH",
        help="Where to write the unit file.",
    ),
    user: str | None = typer.Option(
        None, "--user", help="Run the agent as this user (default: root)."
    ),
) -> None:
    """Write a systemd unit that runs `orbit agent` with these options, then print how to
    start it. The join token is written to an environment file beside the unit (mode 0600),
    never into the unit itself."""
    from orbit.agent.service_unit import write_unit
    from orbit.core.errors import InvalidInput

    url = server or os.environ.get("ORBIT_SERVER")
    if not url:
        raise InvalidInput("--server: give the orbit server's URL (or set ORBIT_SERVER)")
    _labels(labels)
    written = write_unit(
        unit,
        server=url,
        join_token=join_token,
        name=name,
        labels=labels,
        max_tasks=max_tasks,
        work_dir=_work_dir(work_dir),
        user=user,
        orbit=Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None,
    )
    for path in written:
        typer.echo(f"wrote {path}")
    typer.echo(f"start it: systemctl daemon-reload && systemctl enable --now {unit.stem}")
