"""`orbit audit`: the trail of who did what, its hash chain check and its export."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from orbit.cli.common import JSON, console, err, print_json, service

if TYPE_CHECKING:
    from orbit.model.audit_chain import Anchor

audit_app = typer.Typer(invoke_without_command=True)


@audit_app.callback()
def audit(
    ctx: typer.Context,
    run: str | None = typer.Option(None, "--run", "-r", help="Only events of this run."),
    limit: int | None = typer.Option(None, "--limit", "-n", min=1, help="Only the newest N."),
    as_json: bool = JSON,
) -> None:
    """The audit trail: who did what to which run, and when. Each event holds the digest of
    the one before it, so a changed, removed or inserted event breaks the chain; a MAC under
    the audit key ($ORBIT_HOME/audit-key) and a sealed head show one re-hashed or cut short.

    \b
    orbit audit [--run RUN] [--limit N] [--json]   list the events
    orbit audit verify [--anchor FILE]             check the chain; exit 1 naming each problem
    orbit audit checkpoint >> anchors.jsonl        the verified head, to keep elsewhere
    orbit audit export --json [--out FILE]         write the whole chain, hashes included
    orbit audit export --compliance                and policy versions, permission changes,
                                                   roles, users and alerts, for a review
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
def audit_verify(
    anchors: list[Path] = typer.Option(
        [],
        "--anchor",
        metavar="FILE",
        help="Checkpoints from `orbit audit checkpoint` (one JSON a line); each anchored event "
        "must still be in the chain with its hash (repeatable).",
    ),
    as_json: bool = JSON,
) -> None:
    """Check the hash chain: each event's digest and its link to the one before; under the
    audit key, each event's MAC and the seal on the chain's head; and every anchor given.

    Prints the count, the head digest and from which event the chain is keyed, and exits 0;
    or one line per problem on stderr, naming the event, and exits 1.
    """
    anchored = [a for path in anchors for a in read_anchors(path)]
    check = service().verify_audit(anchored)
    if as_json:
        print_json(
            {
                "intact": check.intact,
                "events": check.events,
                "head": check.head,
                "keyed_from": check.keyed_from,
                "key_id": check.key_id,
                "anchors": len(anchored),
                "problems": list(check.problems),
            }
        )
    elif check.intact:
        console.print(f"audit chain intact: {check.events} events")
        if check.head:
            console.print(f"head: {check.head}")
        if check.keyed_from is not None:
            console.print(f"keyed from event {check.keyed_from} (audit key {check.key_id})")
        elif check.events:
            console.print("not keyed yet: no event was written under the audit key")
        if anchored:
            console.print(f"anchors hold: {len(anchored)}")
    else:
        for problem in check.problems:
            err.print(problem)
    if not check.intact:
        raise typer.Exit(1)


@audit_app.command("checkpoint")
def audit_checkpoint() -> None:
    """Verify the chain, then print its head as one JSON line: {"event", "hash", "at"}.

    Keep these lines away from the server (`orbit audit checkpoint >> anchors.jsonl` on
    another machine); `orbit audit verify --anchor anchors.jsonl` then shows whether the
    chain was cut or re-hashed since, even by someone holding the audit key.
    """
    check = service().verify_audit()
    if not check.intact:
        for problem in check.problems:
            err.print(problem)
        err.print("no checkpoint: the chain does not verify")
        raise typer.Exit(1)
    events = service().audit(None, 1)
    if not events:
        from orbit.model.errors import InvalidInput

        raise InvalidInput("no checkpoint: the audit trail is empty")
    head = events[-1]
    import json

    print(json.dumps({"event": head.id, "hash": head.hash, "at": head.at.isoformat()}))


def read_anchors(path: Path) -> list[Anchor]:
    """The checkpoints in `path`, one JSON object a line (what `audit checkpoint` prints)."""
    import json

    from orbit.model.audit_chain import Anchor
    from orbit.model.errors import InvalidInput

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not text"
        raise InvalidInput(f"--anchor: {path}: {why}") from None
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            found.append(Anchor.parse(f"{data['event']}:{data['hash']}"))
        except (ValueError, TypeError, KeyError, InvalidInput):
            raise InvalidInput(
                f'--anchor: {path} line {number}: not a checkpoint ({{"event": ID, "hash": '
                "SHA256}, as `orbit audit checkpoint` prints)"
            ) from None
    if not found:
        raise InvalidInput(f"--anchor: {path}: no checkpoint in it")
    return found


@audit_app.command("export")
def audit_export(
    as_json: bool = typer.Option(True, "--json", help="JSON, the one format (the default)."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Write to this file instead of stdout."
    ),
    compliance: bool = typer.Option(
        False,
        "--compliance",
        help="One JSON object for a review: the events, every policy version as applied, "
        "the permission changes (users' roles, restricted experiments and their members), "
        "the roles and what each holds, and the alerts of the last 500. Needs users.manage.",
    ),
) -> None:
    """Write every event, oldest first, with prev_hash and hash, as one JSON array (or, with
    --compliance, an object holding them and what a review reads beside them)."""
    control = service()
    events = control.audit()
    data: Any = [e.model_dump(mode="json") for e in events]
    if compliance:
        data = _compliance(control, data)
    if out is None:
        print_json(data)
        return
    import json

    out.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    console.print(f"exported {len(events)} events to {out}")


# what a permission change is in the audit trail
PERMISSION_EVENTS = frozenset(
    {
        "user.add",
        "user.remove",
        "user.role",
        "experiment.restricted",
        "experiment.opened",
        "experiment.member_added",
        "experiment.member_removed",
    }
)


def _compliance(control: Any, events: list[dict[str, Any]]) -> dict[str, Any]:
    from datetime import UTC, datetime

    versions = [control.show_policy(v.version) for v in control.policy_history()]
    return {
        "exported_at": datetime.now(UTC).isoformat(),
        "events": events,
        "policy_versions": [v.model_dump(mode="json") for v in versions],
        "permission_changes": [e for e in events if e["action"] in PERMISSION_EVENTS],
        "roles": [r.model_dump(mode="json") for r in control.roles()],
        "users": [u.model_dump(mode="json") for u in control.list_users()],
        "alerts": [a.model_dump(mode="json") for a in control.list_alerts(True)],
    }
