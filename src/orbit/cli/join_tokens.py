"""`orbit nodes join-token`: the tokens an `orbit agent` joins with (create, list, revoke)."""

from __future__ import annotations

from datetime import datetime
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
    settings,
)
from orbit.cli.node_views import labels_text, utc_now
from orbit.cli.text import Table

if TYPE_CHECKING:
    from orbit.model.nodes import JoinTokenRecord

join_app = typer.Typer(
    help="Join tokens: what `orbit agent --join-token` joins with. Each is shown once, when "
    "made (the server keeps its hash); nodes that join with it get its labels.",
    no_args_is_help=True,
)
LABELS_HELP = (
    "Labels for the nodes that join with it, e.g. gpu=h100,zone=b (submissions select nodes "
    "by label; an agent's own --labels go on top)."
)


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
    """Make a join token for `orbit agent --join-token-file`. It is printed this once and
    never again (the server keeps its hash); many nodes may join with one token until it
    expires or is revoked.

    \b
    orbit nodes join-token create --expires 1d --labels gpu=h100,zone=b > join.token
    orbit agent --server URL --join-token-file join.token     # on the GPU server
    """
    from orbit.model.errors import InvalidInput
    from orbit.wire.protocol import parse_labels

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
    err.print(
        "on the GPU server, in a file only root reads (never on a command line): "
        f"orbit agent --server {url} --join-token-file FILE"
    )


@join_app.command("list")
def join_list(as_json: bool = JSON, output: str | None = OUTPUT) -> None:
    """List join tokens: state, labels, expiry, how many nodes joined with each (never the
    tokens themselves)."""
    fmt = output_format(as_json, output)
    tokens = service().list_join_tokens()
    if emitted(fmt, lambda: [t.model_dump(mode="json") for t in tokens]):
        return
    now = utc_now()
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
