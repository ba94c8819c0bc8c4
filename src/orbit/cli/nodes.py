"""`orbit nodes`: in-house GPU servers whose `orbit agent` connects out to the control plane."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from orbit.cli.common import (
    JSON,
    OUTPUT,
    console,
    emitted,
    err,
    output_format,
    print_json,
    service,
)
from orbit.cli.complete import complete_nodes
from orbit.cli.join_tokens import join_app
from orbit.cli.node_views import (
    condition,
    node_json,
    nodes_table,
    reason_line,
    show_node,
    utc_now,
)
from orbit.cli.watching import INTERVAL, WATCH, repeat

if TYPE_CHECKING:
    from orbit.model.nodes import NodeRecord

nodes_app = typer.Typer(
    help="""In-house GPU servers (nodes) that run work for this control plane.

A node is any machine running `orbit agent`: the agent connects out to the orbit server (no
inbound port, no SSH), joins once with a join token, and from then on takes attempts placed
on it. Make a token with `orbit nodes join-token create`, put it in a file on the machine, start
the agent there with `orbit agent --server URL --join-token-file FILE`, and the node shows up in
`orbit nodes list`.

To take a node out of service: `drain` it (no new work; what runs there finishes, and then the
machine is free for people to use by hand), or `cordon` it (no new work for now, its settings
kept; `uncordon` undoes it), or `revoke` it (its agent is locked out at once and its attempts
are lost). Everything but `list` and `show` is for admins.""",
    no_args_is_help=True,
)
nodes_app.add_typer(join_app, name="join-token")

NODE = typer.Argument(
    ...,
    metavar="NODE",
    help="The node's name (or id), as `nodes list` shows.",
    autocompletion=complete_nodes,
)
REASON = typer.Option(
    None,
    "--reason",
    metavar="TEXT",
    help="Why (one line, at most 256 characters): shown by `nodes list` and `nodes show` with "
    "who gave it, and kept in the audit; cleared once the node takes work again.",
)


# --- the commands ---------------------------------------------------------------------------


@nodes_app.command("list")
def nodes_list(
    as_json: bool = JSON,
    output: str | None = OUTPUT,
    watch: bool = WATCH,
    interval: float = INTERVAL,
) -> None:
    """List nodes: how each stands (CONDITION), what it runs and has, when it was last heard,
    and why it is out of service (REASON: drain or cordon --reason, and who gave it).

    \b
    CONDITION: ready | busy (running max-tasks attempts) | offline (no heartbeat lately)
    | cordoned | draining | drained (free for people) | revoked
    """
    fmt = output_format(as_json, output)
    repeat(lambda: _nodes_list(fmt), watch, interval)


def _nodes_list(fmt: str) -> bool:
    nodes = service().list_nodes()
    now = utc_now()
    if emitted(fmt, lambda: [node_json(n, now) for n in nodes], "name"):
        return False
    if not nodes:
        err.print("no nodes yet: make a join token (orbit nodes join-token create) and start")
        err.print("`orbit agent --server URL --join-token-file FILE` on the GPU server")
    else:
        console.print(nodes_table(nodes))
    return False


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


def _reason_said(node: NodeRecord) -> list[str]:
    return [f"  reason: {reason_line(node)}"] if node.reason else []


def _done(found: NodeRecord, as_json: bool, *lines: str) -> None:
    if as_json:
        print_json(node_json(found))
        return
    for line in lines:
        console.print(line)


@nodes_app.command("drain")
def nodes_drain(node: str = NODE, reason: str | None = REASON, as_json: bool = JSON) -> None:
    """No new work; what runs finishes, then the node is free for people (max tasks 0).

    The attempts running there finish as they would; once the last has ended the node reads
    `drained (free for people)` and ORBIT places nothing there, so people can use the machine
    by hand. Undo: orbit nodes set NODE --max-tasks N. (`cordon` is the short pause instead.)

    \b
    orbit nodes drain gpu-a --reason "fan replacement, ticket 4711"
    """
    control = service()
    before = control.get_node(node)
    found = control.set_node(before.id, max_tasks=0, reason=reason)
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
        *_reason_said(found),
        f"  undo: orbit nodes set {found.name} --max-tasks {before.max_tasks or 1}",
    )


@nodes_app.command("cordon")
def nodes_cordon(node: str = NODE, reason: str | None = REASON, as_json: bool = JSON) -> None:
    """No new work for now; what runs there goes on. `uncordon` undoes it.

    For a short pause (maintenance, a look at something): its max tasks is kept, and
    `uncordon` lets it take work again as before. To hand the machine to people once its
    work is done, `drain` it instead.
    """
    found = service().set_node(node, cordon=True, reason=reason)
    _done(
        found,
        as_json,
        f"cordoned {found.name}: it takes no new work; what runs there goes on",
        *_reason_said(found),
        f"  undo: orbit nodes uncordon {found.name}",
    )


@nodes_app.command("uncordon")
def nodes_uncordon(node: str = NODE, as_json: bool = JSON) -> None:
    """Let a cordoned node take new work again (its reason, if any, is cleared)."""
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
    """Change a node's settings: how many attempts it runs at once (above 0, a drained
    node's reason is cleared)."""
    from orbit.model.errors import InvalidInput

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
    from orbit.model.errors import InvalidInput
    from orbit.model.nodes import MAX_TRANSFER_BYTES

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
