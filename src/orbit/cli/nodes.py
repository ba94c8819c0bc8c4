"""`orbit nodes`: in-house GPU servers whose `orbit agent` connects out to the control plane."""

from __future__ import annotations

import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from orbit.cli.common import JSON, console, err, print_json, service, settings
from orbit.cli.text import Table, paint

if TYPE_CHECKING:
    from orbit.core.nodes import JoinTokenRecord, NodeRecord

nodes_app = typer.Typer(
    help="""In-house GPU servers (nodes) that run work for this control plane.

A node is any machine running `orbit agent`: the agent connects out to the orbit server (no
inbound port, no SSH), joins once with a join token, and from then on takes attempts placed
on it. Make a token with `orbit nodes join-token create`, start the agent on the machine with
`orbit agent --server URL --join-token TOKEN`, and the node shows up in `orbit nodes list`.

To take a node out of service: `drain` it (no new work; what runs there finishes, and then the
machine is free for people to use by hand), or `cordon` it (no new work for now, its settings
kept; `uncordon` undoes it), or `revoke` it (its agent is locked out at once and its attempts
are lost). Everything but `list` and `show` is for admins.""",
    no_args_is_help=True,
)
join_app = typer.Typer(
    help="Join tokens: what `orbit agent --join-token` joins with. Each is shown once, when "
    "made (the server keeps its hash); nodes that join with it get its labels.",
    no_args_is_help=True,
)
nodes_app.add_typer(join_app, name="join-token")

NODE = typer.Argument(..., metavar="NODE", help="The node's name (or id), as `nodes list` shows.")
LABELS_HELP = (
    "Labels for the nodes that join with it, e.g. gpu=h100,zone=b (submissions select nodes "
    "by label; an agent's own --labels go on top)."
)


# --- how a node reads ---------------------------------------------------------------------


def _now() -> datetime:
    return datetime.now(UTC)


def condition(node: NodeRecord, now: datetime | None = None) -> str:
    """As the control plane that gave the record judges it (its offline timeout, not this
    shell's)."""
    return node.condition(now or _now())


def node_json(node: NodeRecord, now: datetime | None = None) -> dict[str, Any]:
    now = now or _now()
    data = node.model_dump(mode="json")
    data["condition"] = condition(node, now)
    data["online"] = node.online(now)
    return data


def gpus_cell(info: dict[str, Any]) -> str:
    """`0`, `8x H100 80GB HBM3`, or `4x A100, 2x L4` for a mixed node."""
    gpus = list(info.get("accelerators") or ())
    if not gpus:
        return "0"
    models = Counter(str(g.get("model") or "").removeprefix("NVIDIA ").strip() for g in gpus)
    if set(models) == {""}:
        return str(len(gpus))
    return ", ".join(f"{n}x {model or '?'}" for model, n in models.items())


def mib(value: Any) -> str:
    megabytes = int(value or 0)
    if not megabytes:
        return "?"
    if megabytes >= 1024 * 1024:
        return f"{megabytes / 1024 / 1024:.1f} TiB"
    if megabytes >= 10 * 1024:
        return f"{megabytes / 1024:.0f} GiB"
    return f"{megabytes / 1024:.1f} GiB" if megabytes >= 1024 else f"{megabytes} MiB"


def labels_text(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "-"


def seen(node: NodeRecord) -> str:
    from orbit.cli.render import ago

    return "never" if node.last_seen_at is None else ago(node.last_seen_at)


CONDITION_STYLE = {"ready": "green", "busy": "cyan", "offline": "red", "revoked": "red"}


def nodes_table(nodes: list[NodeRecord]) -> Table:
    now = _now()
    table = Table("NAME", "CONDITION", "RUNNING", "GPUS", "CPUS", "MEM", "LAST SEEN", "LABELS")
    for node in nodes:
        said = condition(node, now)
        table.add_row(
            node.name,
            paint(said, CONDITION_STYLE.get(said, "yellow")),
            f"{len(node.running)}/{node.max_tasks}",
            gpus_cell(node.info),
            str(node.info.get("cpus") or "?"),
            mib(node.info.get("memory_mb")),
            seen(node),
            labels_text(node.labels),
        )
    return table


def show_node(node: NodeRecord) -> None:
    info = node.info
    now = _now()
    said = condition(node, now)
    console.print(f"{paint(node.name, 'bold')}  {node.id}  {said}")
    agent = str(info.get("agent_version") or "?")
    if info.get("protocol") is not None:
        agent += f" (protocol {info['protocol']})"
    if info.get("hostname"):
        agent += f" on {info['hostname']}"
    docker = "yes" if info.get("docker") else "no"
    rows = [
        ("state", f"{node.state.value}, at most {node.max_tasks} attempt(s) at once"),
        ("running", f"{len(node.running)}/{node.max_tasks}" + _listed(node.running, ": ")),
        ("labels", labels_text(node.labels)),
        (
            "last seen",
            "never"
            if node.last_seen_at is None
            else f"{seen(node)} ({node.last_seen_at:%Y-%m-%d %H:%M:%S} UTC)",
        ),
        ("joined", f"{node.created_at:%Y-%m-%d %H:%M} UTC with {node.created_by}"),
        ("agent", agent),
        ("cpus", str(info.get("cpus") or "?")),
        ("memory", mib(info.get("memory_mb"))),
        ("disk free", f"{mib(info.get('disk_free_mb'))} in the agent's work dir"),
        ("docker", f"{docker}, nvidia runtime {'yes' if info.get('nvidia_runtime') else 'no'}"),
        ("cached models", ", ".join(info.get("cached_models") or ()) or "-"),
        ("cached datasets", ", ".join(info.get("cached_datasets") or ()) or "-"),
    ]
    gpus = list(info.get("accelerators") or ())
    source = f" (found by {info['accelerator_source']})" if info.get("accelerator_source") else ""
    rows.append(("gpus", f"{gpus_cell(info)}{source}"))
    for label, value in rows:
        console.print(f"  {label + ':':<17}{value}")
    for gpu in gpus:
        index = int(gpu.get("index", -1))
        used = node.gpus_in_use.get(index)
        use = "free" if used is None else "in use" if used == 0 else f"{used:g} GB reserved"
        peers = ",".join(str(p) for p in gpu.get("nvlink_peers") or ()) or "-"
        console.print(
            f"    {index}  {gpu.get('model') or '?'}  {mib(gpu.get('memory_mb'))}  "
            f"uuid {gpu.get('uuid') or '?'}  nvlink peers {peers}  {use}"
        )


def _listed(items: tuple[str, ...], lead: str) -> str:
    return lead + ", ".join(items) if items else ""


# --- the commands ---------------------------------------------------------------------------


@nodes_app.command("list")
def nodes_list(as_json: bool = JSON) -> None:
    """List nodes: how each stands (CONDITION), what it runs and has, when it was last heard.

    \b
    CONDITION: ready | busy (running max-tasks attempts) | offline (no heartbeat lately)
    | cordoned | draining | drained (free for people) | revoked
    """
    nodes = service().list_nodes()
    if as_json:
        now = _now()
        print_json([node_json(n, now) for n in nodes])
    elif not nodes:
        err.print("no nodes yet: make a join token (orbit nodes join-token create) and start")
        err.print("`orbit agent --server URL --join-token TOKEN` on the GPU server")
    else:
        console.print(nodes_table(nodes))


@nodes_app.command("show")
def nodes_show(node: str = NODE, as_json: bool = JSON) -> None:
    """One node: its GPUs (uuid, memory, NVLink peers, what is reserved), CPUs, memory, free
    disk, docker and the nvidia runtime, its agent's version, the models and datasets cached
    there, and the attempts it runs."""
    found = service().get_node(node)
    if as_json:
        print_json(node_json(found))
    else:
        show_node(found)


def _done(found: NodeRecord, as_json: bool, *lines: str) -> None:
    if as_json:
        print_json(node_json(found))
        return
    for line in lines:
        console.print(line)


@nodes_app.command("drain")
def nodes_drain(node: str = NODE, as_json: bool = JSON) -> None:
    """No new work; what runs finishes, then the node is free for people (max tasks 0).

    The attempts running there finish as they would; once the last has ended the node reads
    `drained (free for people)` and ORBIT places nothing there, so people can use the machine
    by hand. Undo: orbit nodes set NODE --max-tasks N. (`cordon` is the short pause instead.)
    """
    control = service()
    before = control.get_node(node)
    found = control.set_node(before.id, max_tasks=0)
    running = len(found.running)
    then = (
        f"its {running} running attempt(s) finish, and then it is free for people"
        if running
        else "nothing runs there: it is free for people now"
    )
    _done(
        found,
        as_json,
        f"draining {found.name}: it takes no new work; {then}",
        f"  undo: orbit nodes set {found.name} --max-tasks {before.max_tasks or 1}",
    )


@nodes_app.command("cordon")
def nodes_cordon(node: str = NODE, as_json: bool = JSON) -> None:
    """No new work for now; what runs there goes on. `uncordon` undoes it.

    For a short pause (maintenance, a look at something): its max tasks is kept, and
    `uncordon` lets it take work again as before. To hand the machine to people once its
    work is done, `drain` it instead.
    """
    found = service().set_node(node, cordon=True)
    _done(
        found,
        as_json,
        f"cordoned {found.name}: it takes no new work; what runs there goes on",
        f"  undo: orbit nodes uncordon {found.name}",
    )


@nodes_app.command("uncordon")
def nodes_uncordon(node: str = NODE, as_json: bool = JSON) -> None:
    """Let a cordoned node take new work again."""
    found = service().set_node(node, cordon=False)
    _done(found, as_json, f"uncordoned {found.name}: it takes new work ({condition(found)})")


@nodes_app.command("set")
def nodes_set(
    node: str = NODE,
    max_tasks: int | None = typer.Option(
        None,
        "--max-tasks",
        metavar="N",
        help="Attempts it runs at once (0 to 1024; 0 drains it).",
    ),
    as_json: bool = JSON,
) -> None:
    """Change a node's settings: how many attempts it runs at once."""
    from orbit.core.errors import InvalidInput

    if max_tasks is None:
        raise InvalidInput("nodes set: nothing to change (give --max-tasks N)")
    found = service().set_node(node, max_tasks=max_tasks)
    _done(found, as_json, f"{found.name}: at most {found.max_tasks} attempt(s) at once")


@nodes_app.command("revoke")
def nodes_revoke(node: str = NODE, as_json: bool = JSON) -> None:
    """Lock a node out at once: its agent is refused from the next request on.

    The attempts it runs are lost (and retried elsewhere, as their retry policy says). A
    revoked node stays listed until removed; to let it back, remove it and join it again.
    """
    found = service().revoke_node(node)
    running = len(found.running)
    _done(
        found,
        as_json,
        f"revoked {found.name}: its agent is refused from now on"
        + (f"; its {running} attempt(s) are lost" if running else ""),
        f"  to let it back: orbit nodes remove {found.name}, then join its agent again",
    )


@nodes_app.command("remove")
def nodes_remove(
    node: str = NODE,
    force: bool = typer.Option(
        False,
        "--force",
        help="Even while it runs attempts (they are lost, and retried elsewhere).",
    ),
    as_json: bool = JSON,
) -> None:
    """Forget a node; refused while it runs attempts, unless --force.

    Drain it and wait for its work to end first, or --force (its attempts are lost, and
    retried elsewhere). Its agent can no longer connect; its runs stay, with their logs.
    """
    found = service().remove_node(node, force)
    running = len(found.running)
    _done(
        found,
        as_json,
        f"removed node {found.name}"
        + (f"; its {running} running attempt(s) are lost" if running else ""),
    )


@nodes_app.command("push")
def nodes_push(
    node: str = NODE,
    src: str = typer.Argument(..., metavar="SRC", help="A local file (`-`: standard input)."),
    dest: str = typer.Argument(..., metavar="DEST", help="Where, under the agent's work dir."),
    as_json: bool = JSON,
) -> None:
    """Copy a file (at most 48 MiB) to a node, under its agent's work dir. The node must be
    online: its agent fetches the file from the server."""
    from orbit.core.errors import InvalidInput
    from orbit.core.nodes import MAX_TRANSFER_BYTES

    try:
        if src == "-":
            data = sys.stdin.buffer.read(MAX_TRANSFER_BYTES + 1)
        else:
            with Path(src).open("rb") as file:
                data = file.read(MAX_TRANSFER_BYTES + 1)
    except OSError as exc:
        raise InvalidInput(f"{src}: {exc.strerror or exc}") from None
    if len(data) > MAX_TRANSFER_BYTES:
        raise InvalidInput(f"{src}: larger than a push takes ({MAX_TRANSFER_BYTES:,} bytes)")
    result = service().push_file(node, data, dest)
    if as_json:
        print_json({"node": node, "dest": dest, "size": len(data), "result": result})
    else:
        console.print(f"pushed {len(data):,} bytes to {node}:{dest}")


@nodes_app.command("pull")
def nodes_pull(
    node: str = NODE,
    path: str = typer.Argument(..., metavar="PATH", help="A file under the agent's work dir."),
    output: Path | None = typer.Option(
        None, "--output", "-o", metavar="FILE", help="Write it here (default: standard output)."
    ),
) -> None:
    """Copy a file (at most 48 MiB) from under a node's work dir: to standard output, or to
    FILE with -o. The node must be online."""
    data = service().pull_file(node, path)
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    output.write_bytes(data)
    err.print(f"pulled {len(data):,} bytes from {node}:{path} to {output}")


# --- join tokens ------------------------------------------------------------------------------


def _token_state(token: JoinTokenRecord, now: datetime) -> str:
    if token.revoked_at is not None:
        return "revoked"
    if token.expires_at is not None and token.expires_at <= now:
        return "expired"
    return "active"


@join_app.command("create")
def join_create(
    expires: str | None = typer.Option(
        None, "--expires", metavar="DURATION", help="e.g. 30d, 12h (default: until revoked)."
    ),
    labels: str | None = typer.Option(None, "--labels", metavar="K=V,...", help=LABELS_HELP),
    as_json: bool = JSON,
) -> None:
    """Make a join token for `orbit agent --join-token`. It is printed this once and never
    again (the server keeps its hash); many nodes may join with one token until it expires
    or is revoked.

    \b
    orbit nodes join-token create --expires 1d --labels gpu=h100,zone=b
    orbit agent --server URL --join-token TOKEN     # on the GPU server
    """
    from orbit.agent.protocol import parse_labels
    from orbit.core.errors import InvalidInput

    try:
        parsed = parse_labels(labels) if labels else {}
    except ValueError as exc:
        raise InvalidInput(f"--labels: {exc}") from None
    made = service().create_join_token(parsed, expires)
    if as_json:
        print_json({"token": made.token, **made.record.model_dump(mode="json")})
        return
    print(made.token)
    url = settings().server or "URL"
    err.print(f"join token {made.record.id}: shown this once; store it now", style="dim")
    err.print(f"on the GPU server: orbit agent --server {url} --join-token {made.token}")


@join_app.command("list")
def join_list(as_json: bool = JSON) -> None:
    """List join tokens: state, labels, expiry, how many nodes joined with each (never the
    tokens themselves)."""
    tokens = service().list_join_tokens()
    if as_json:
        print_json([t.model_dump(mode="json") for t in tokens])
        return
    now = _now()
    table = Table("ID", "STATE", "LABELS", "EXPIRES", "USES", "CREATED", "BY")
    for t in tokens:
        table.add_row(
            t.id,
            _token_state(t, now),
            labels_text(t.labels),
            f"{t.expires_at:%Y-%m-%d %H:%M}" if t.expires_at else "never",
            str(t.uses),
            f"{t.created_at:%Y-%m-%d %H:%M}",
            t.created_by,
        )
    console.print(table)


@join_app.command("revoke")
def join_revoke(
    token_id: str = typer.Argument(
        ..., metavar="ID", help="The join token's id (join-token list)."
    ),
) -> None:
    """Revoke a join token: no node joins with it from now on. Nodes that already joined
    keep working (revoke those with `orbit nodes revoke NODE`)."""
    service().revoke_join_token(token_id)
    console.print(f"revoked join token {token_id}")
