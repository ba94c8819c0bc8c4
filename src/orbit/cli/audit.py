"""`orbit audit`: the trail of who did what, its hash chain check and its export."""

from __future__ import annotations

from pathlib import Path

import typer

from orbit.cli.common import JSON, console, err, print_json, service

audit_app = typer.Typer(invoke_without_command=True)


@audit_app.callback()
def audit(
    ctx: typer.Context,
    run: str | None = typer.Option(None, "--run", "-r", help="Only events of this run."),
    limit: int | None = typer.Option(None, "--limit", "-n", min=1, help="Only the newest N."),
    as_json: bool = JSON,
) -> None:
    """The audit trail: who did what to which run, and when. Each event holds the digest of
    the one before it, so a changed, removed or inserted event breaks the chain.

    \b
    orbit audit [--run RUN] [--limit N] [--json]   list the events
    orbit audit verify                             check the chain; exit 1 naming each problem
    orbit audit export --json [--out FILE]         write the whole chain, hashes included
    """
    if ctx.invoked_subcommand is not None:
        return
    events = service().audit(run, limit)
    if as_json:
        print_json([e.model_dump(mode="json") for e in events])
    else:
        from orbit.cli import render

        console.print(render.audit_table(events))


@audit_app.command("verify")
def audit_verify(as_json: bool = JSON) -> None:
    """Check the hash chain: each event's digest and its link to the one before.

    Prints the count and the head digest (keep it elsewhere: a chain cut short at its end is
    still whole) and exits 0; or one line per problem on stderr, naming the event, and exits 1.
    """
    check = service().verify_audit()
    if as_json:
        print_json(
            {
                "intact": check.intact,
                "events": check.events,
                "head": check.head,
                "problems": list(check.problems),
            }
        )
    elif check.intact:
        console.print(f"audit chain intact: {check.events} events")
        if check.head:
            console.print(f"head: {check.head}")
    else:
        for problem in check.problems:
            err.print(problem)
    if not check.intact:
        raise typer.Exit(1)


@audit_app.command("export")
def audit_export(
    as_json: bool = typer.Option(True, "--json", help="JSON, the one format (the default)."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Write to this file instead of stdout."
    ),
) -> None:
    """Write every event, oldest first, with prev_hash and hash, as one JSON array."""
    events = service().audit()
    data = [e.model_dump(mode="json") for e in events]
    if out is None:
        print_json(data)
        return
    import json

    out.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    console.print(f"exported {len(data)} events to {out}")
