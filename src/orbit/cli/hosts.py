"""`orbit hosts`: the registry of SSH hosts runs can target (rented GPU boxes, a colleague's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from orbit.cli.common import JSON, OUTPUT, console, emitted, err, output_format, print_json, service
from orbit.cli.text import paint

if TYPE_CHECKING:
    from orbit.model.hosts import HostRecord

hosts_app = typer.Typer(
    help="SSH hosts that runs can target: add one, then submit with --set target=NAME.",
    no_args_is_help=True,
)
NAME = typer.Argument(..., metavar="NAME", help="The host's name in ORBIT, e.g. h100-a.")


def host_json(host: HostRecord) -> dict[str, Any]:
    return host.model_dump(mode="json")


def show_host(host: HostRecord) -> None:
    from orbit.cli.render import describe_facts

    spec = host.spec
    console.print(f"{paint(spec.name, 'bold')}  ssh {spec.ssh}")
    rows = [
        ("port", str(spec.port) if spec.port else "(from ssh config, or 22)"),
        ("identity", spec.identity or "(from ssh config / agent)"),
        ("proxy jump", spec.proxy_jump or "-"),
        ("work dir", spec.work_dir),
        ("python", spec.python),
        ("unreachable after", f"{spec.unreachable_timeout_s:.0f}s without contact"),
    ]
    if spec.accept_new_host_key:
        rows.append(("host key", "accepted on first use (--accept-new-host-key)"))
    rows += describe_facts(host.facts) if host.facts else [("checked", "never")]
    for label, value in rows:
        console.print(f"  {label + ':':<19}{value}")


@hosts_app.command("add")
def hosts_add(
    name: str = NAME,
    ssh: str = typer.Option(
        ...,
        "--ssh",
        metavar="USER@ADDRESS|ALIAS",
        help="How ssh reaches it: root@203.0.113.7, or a Host alias from your ~/.ssh/config.",
    ),
    port: int | None = typer.Option(None, "--port", "-p", help="SSH port (default: ssh's)."),
    identity: str | None = typer.Option(
        None, "--identity", "-i", metavar="KEY", help="Private key file (default: ssh's)."
    ),
    proxy_jump: str | None = typer.Option(
        None, "--proxy-jump", "-J", metavar="JUMP", help="Reach it through this host."
    ),
    work_dir: str = typer.Option(
        ".orbit-work",
        "--work-dir",
        help="Where bundles and attempts live on the host (relative: under the login's home).",
    ),
    python: str = typer.Option("python3", "--python", help="The host's python3 for the wrapper."),
    unreachable_timeout: float = typer.Option(
        600,
        "--unreachable-timeout",
        metavar="SECONDS",
        help="After this long without contact a run there ends as terminated (host_unreachable) "
        "and its retry policy applies; until then it keeps its state.",
    ),
    accept_new_host_key: bool = typer.Option(
        False,
        "--accept-new-host-key",
        help="Trust the host's key the first time it is seen (never a changed one). Without "
        "it, the key must already be in known_hosts.",
    ),
    check: bool = typer.Option(
        True, "--check/--no-check", help="Probe the host first; do not add it if that fails."
    ),
    as_json: bool = JSON,
) -> None:
    """Register an SSH host; it is checked over SSH first (OS, python3, GPUs, disk, docker).

    \b
    orbit hosts add h100-a --ssh root@203.0.113.7 --port 2222 --identity ~/.ssh/targon
    orbit hosts add box --ssh my-alias          # everything else from ~/.ssh/config
    orbit submit spec.yaml --set target=h100-a  # with the targon-rental-host template
    """
    from pydantic import ValidationError

    from orbit.model.errors import InvalidInput, describe_validation_error
    from orbit.model.hosts import HostSpec

    try:
        spec = HostSpec(
            name=name,
            ssh=ssh,
            port=port,
            identity=identity,
            proxy_jump=proxy_jump,
            work_dir=work_dir,
            python=python,
            unreachable_timeout_s=unreachable_timeout,
            accept_new_host_key=accept_new_host_key,
        )
    except ValidationError as exc:
        raise InvalidInput(describe_validation_error("hosts add", exc)) from None
    host = service().add_host(spec, check=check)
    if as_json:
        print_json(host_json(host))
        return
    console.print(f"added host {host.name}")
    show_host(host)


@hosts_app.command("list")
def hosts_list(as_json: bool = JSON, output: str | None = OUTPUT) -> None:
    """List registered hosts with what their last check found."""
    from orbit.cli import render

    fmt = output_format(as_json, output)
    hosts = service().list_hosts()
    if emitted(fmt, lambda: [host_json(h) for h in hosts], "name"):
        return
    table = render.table("NAME", "SSH", "GPUS", "PYTHON", "DISK FREE", "CHECKED")
    for h in hosts:
        f = h.facts
        ssh = h.spec.ssh + (f":{h.spec.port}" if h.spec.port else "")
        if f is None:
            table.add_row(h.name, ssh, "?", "?", "?", "never")
            continue
        free = "?" if f.disk_free_bytes is None else f"{f.disk_free_bytes / 2**30:.1f} GiB"
        table.add_row(
            h.name,
            ssh,
            str(len(f.gpus)) + (f" x {f.gpus[0].name}" if f.gpus else ""),
            f.python_version or "MISSING",
            free,
            f"{f.checked_at:%Y-%m-%d %H:%M}",
        )
    console.print(table)


@hosts_app.command("show")
def hosts_show(name: str = NAME, as_json: bool = JSON) -> None:
    """One host: how it is reached and what its last check found."""
    host = service().get_host(name)
    if as_json:
        print_json(host_json(host))
    else:
        show_host(host)


@hosts_app.command("check")
def hosts_check(name: str = NAME, as_json: bool = JSON) -> None:
    """Probe a host again and record what it has; sweep ORBIT's strays there.

    It records OS, python3, GPUs (nvidia-smi), free disk in the work dir, docker and rsync;
    submissions are validated against that. Processes there of this control plane's attempts
    that have ended are stopped; where it has docker, ORBIT's containers there that no live run
    owns are stopped and removed (others' processes and containers are never touched).
    """
    checked = service().check_host(name)
    host, removed = checked.host, list(checked.removed_containers)
    processes = {k: list(v) for k, v in checked.stopped_processes.items()}
    if as_json:
        print_json(
            host_json(host) | {"removed_containers": removed, "stopped_processes": processes}
        )
        return
    show_host(host)
    if processes:
        console.print(
            f"stopped {sum(map(len, processes.values()))} process(es) of ended attempts: "
            f"{', '.join(sorted(processes))}",
        )
    if removed:
        console.print(
            f"removed {len(removed)} ORBIT container(s) no live run owns: {', '.join(removed)}",
        )
    for problem in checked.sweep_errors:
        err.print(f"orbit: the container sweep failed: {problem}")
    for problem in checked.process_errors:
        err.print(f"orbit: the process sweep failed: {problem}")


@hosts_app.command("remove")
def hosts_remove(name: str = NAME) -> None:
    """Forget a host. Runs on it are not touched and can still be followed and collected."""
    active = service().remove_host(name)
    console.print(f"removed host {name}")
    if active:
        err.print(
            f"note: {len(active)} run(s) still active there ({', '.join(active)}); "
            "they keep what they need to be followed, cancelled and collected",
        )
