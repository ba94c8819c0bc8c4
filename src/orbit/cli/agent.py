"""`orbit agent`: run this machine as a node of an orbit server; it only ever connects out."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from orbit.agent.cleanup import CleanupOptions

agent_app = typer.Typer(no_args_is_help=False, invoke_without_command=True)

DEFAULT_WORK_DIR = Path("/var/lib/orbit-agent")


def _work_dir(given: Path | None) -> Path:
    if given is not None:
        return given.expanduser()
    if os.geteuid() == 0:
        return DEFAULT_WORK_DIR
    return Path("~/.orbit-agent").expanduser()


def _join_token(given: str | None, path: Path | None) -> str | None:
    """The join token from stdin (--join-token-file -) or ORBIT_JOIN_TOKEN, which is then
    taken out of this process's environment: nothing the agent starts (a task, a container)
    inherits it. Never from argv, where `ps` shows it for the agent's whole life. A file
    (--join-token-file FILE) is read by the agent, and only if it has not joined yet."""
    from orbit.model.errors import InvalidInput

    from_env = os.environ.pop("ORBIT_JOIN_TOKEN", None)
    if given is not None:
        raise InvalidInput(
            "--join-token: a token on the command line is visible in `ps` and shell history; "
            "put it in a file (mode 0600) and give --join-token-file FILE, or pipe it in with "
            "--join-token-file -"
        )
    if path is not None and str(path) == "-":
        from orbit.agent.daemon import read_join_token

        return read_join_token(sys.stdin.read(), "--join-token-file -")
    if path is not None:
        return None  # the file wins: the agent reads it when it has not joined yet
    return (from_env or "").strip() or None


def _read_file(path: Path) -> str:
    from orbit.agent.daemon import read_join_token
    from orbit.model.errors import InvalidInput

    try:
        return read_join_token(path.expanduser().read_text(), f"--join-token-file {path}")
    except OSError as exc:
        raise InvalidInput(f"--join-token-file: {path}: {exc.strerror or exc}") from None


def _labels(text: str | None) -> dict[str, str]:
    from orbit.model.errors import InvalidInput
    from orbit.wire.protocol import parse_labels

    if not text:
        return {}
    try:
        return parse_labels(text)
    except ValueError as exc:
        raise InvalidInput(f"--labels: {exc}") from None


def _services(texts: list[str]) -> tuple[tuple[str, str], ...]:
    from orbit.model.errors import InvalidInput
    from orbit.wire.protocol import parse_service

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
JOIN_FILE = typer.Option(
    None,
    "--join-token-file",
    metavar="FILE",
    help="The join token, needed the first time only (`orbit nodes join-token create` makes "
    "one): a file holding it (mode 0600), or - to read it from stdin. Used once to join; the "
    "node keeps only its own credential, in the work dir (mode 0600). A file in the work dir "
    "named join-token is removed once joined. ORBIT_JOIN_TOKEN also serves (and is taken out "
    "of the agent's environment at once).",
)
JOIN = typer.Option(
    None,
    "--join-token",
    metavar="TOKEN",
    hidden=True,  # refused: a token in argv is in `ps` and shell history (see _join_token)
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
    "root, else ~/.orbit-agent). `orbit nodes push` and `pull` are confined to it.",
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
TASK_UIDS = typer.Option(
    None,
    "--task-uids",
    metavar="FIRST-LAST|none",
    help="Who tasks run as. As root (the default for a service): each attempt's wrapper and "
    "task run as a uid of their own from this range (default 2000000000-2000000999; uids an "
    "account or a process already has are skipped), so that no task reads the agent's "
    "credential, writes its bundle cache or reaches another attempt. `none`: as the agent's "
    "own user (the only choice when the agent is not root).",
)
CA = typer.Option(
    None, "--ca-file", metavar="PEM", help="Trust this CA for the server's certificate."
)
CLEAN_AFTER = typer.Option(
    "1d",
    "--clean-after",
    metavar="DURATION",
    help="Remove an ended attempt's folder this long after it ended (12h, 7d, ...), once "
    "every file of it is on the control plane. Never one that runs or still uploads.",
)
MIN_FREE = typer.Option(
    "10%",
    "--min-free",
    metavar="PERCENT",
    help="While less than this share of the work dir's filesystem is free, remove ended, "
    "uploaded attempts' folders at once (oldest first), then cached bundles no live "
    "attempt uses (fetched again when needed).",
)


def _cleanup(clean_after: str, min_free: str) -> CleanupOptions:
    from orbit.agent.cleanup import CleanupOptions
    from orbit.model.durations import parse_duration
    from orbit.model.errors import InvalidInput

    after = parse_duration(clean_after, "--clean-after").total_seconds()
    text = min_free.strip().removesuffix("%")
    try:
        share = float(text) / 100
    except ValueError:
        share = -1.0
    if not 0 <= share <= 1:
        raise InvalidInput(f"--min-free: expected a percentage from 0% to 100%, got {min_free!r}")
    return CleanupOptions(clean_after_s=after, min_free=share)


@agent_app.callback()
def agent(
    ctx: typer.Context,
    server: str | None = SERVER,
    join_token_file: Path | None = JOIN_FILE,
    join_token: str | None = JOIN,
    name: str | None = NAME,
    labels: str | None = LABELS,
    max_tasks: int = MAX_TASKS,
    work_dir: Path | None = WORK_DIR,
    model: list[str] | None = MODELS,
    dataset: list[str] | None = DATASETS,
    service: list[str] | None = SERVICES,
    address: str | None = ADDRESS,
    task_uids: str | None = TASK_UIDS,
    ca_file: Path | None = CA,
    clean_after: str = CLEAN_AFTER,
    min_free: str = MIN_FREE,
) -> None:
    """Run this machine as a node: it registers once with a join token, then keeps a
    long-poll open to the server, runs the attempts placed on it, and streams their logs and
    files back. It listens on no port. Stop it with SIGTERM (systemctl stop): what it runs
    goes on, and a restarted agent picks it up again.

    \b
      orbit agent --server https://orbit.example:8470 --join-token-file join.token \\
          --labels gpu=h100,rack=b2 --max-tasks 4
    """
    if ctx.invoked_subcommand is not None:
        return
    import logging
    import signal

    from orbit.agent.daemon import Agent, AgentOptions
    from orbit.agent.isolation import parse_uids
    from orbit.model.errors import InvalidInput

    url = server or os.environ.get("ORBIT_SERVER")
    if not url:
        raise InvalidInput("--server: give the orbit server's URL (or set ORBIT_SERVER)")
    token = _join_token(join_token, join_token_file)
    cleanup = _cleanup(clean_after, min_free)
    logging.basicConfig(
        level=os.environ.get("ORBIT_AGENT_LOG", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    options = AgentOptions(
        server=url,
        work_dir=_work_dir(work_dir),
        join_token=token,
        join_token_file=None if str(join_token_file) == "-" else join_token_file,
        name=name,
        labels=_labels(labels),
        max_tasks=max_tasks,
        models=tuple(model or ()),
        datasets=tuple(dataset or ()),
        services=_services(service or []),
        address=address or "",
        verify=str(ca_file) if ca_file else True,
        task_uids=parse_uids(task_uids),
        cleanup=cleanup,
    )
    daemon = Agent(options)
    signal.signal(signal.SIGTERM, lambda *_: daemon.shutdown())
    signal.signal(signal.SIGINT, lambda *_: daemon.shutdown())
    sys.exit(daemon.run())


@agent_app.command("install-service")
def install_service(
    server: str | None = SERVER,
    join_token_file: Path | None = JOIN_FILE,
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
    start it. The join token is copied into the work dir as `join-token` (mode 0600, the
    work dir's owner only), never into the unit, which anyone can read; the agent joins with
    it once and removes it."""
    from orbit.agent.service_unit import write_unit
    from orbit.model.errors import InvalidInput

    url = server or os.environ.get("ORBIT_SERVER")
    if not url:
        raise InvalidInput("--server: give the orbit server's URL (or set ORBIT_SERVER)")
    _labels(labels)
    written = write_unit(
        unit,
        server=url,
        join_token=_join_token(join_token, join_token_file)
        or (_read_file(join_token_file) if join_token_file else None),
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
