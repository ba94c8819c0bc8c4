"""`orbit runs delete|pin|unpin`, `orbit gc` and `orbit usage`: storage with a lifecycle."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from orbit.cli.common import JSON, RUN, console, err, print_json, service
from orbit.cli.complete import complete_runs
from orbit.cli.runs import runs_app

if TYPE_CHECKING:
    from orbit.model.storage import GcReport

DRY_RUN = typer.Option(False, "--dry-run", help="Say what would be removed; remove nothing.")


@runs_app.command("delete")
def runs_delete(
    runs: list[str] = typer.Argument(
        ..., metavar="RUN...", help="Run ids, or unique prefixes.", autocompletion=complete_runs
    ),
    dry_run: bool = DRY_RUN,
    as_json: bool = JSON,
) -> None:
    """Remove runs' artifacts on the server and on their nodes, and each bundle no other run
    uses. Each run's record and audit trail stay, marked deleted. All or nothing: refused,
    removing nothing, if one of them is pinned or still running (cancel it first)."""
    report_removals(service().delete_runs(runs, dry_run=dry_run), as_json)


@runs_app.command("pin")
def runs_pin(run: str = RUN, as_json: bool = JSON) -> None:
    """Keep a run: retention and gc never touch it, and it cannot be deleted until unpinned."""
    marks = service().pin_run(run, True)
    if as_json:
        print_json({"run": run, **marks.model_dump(mode="json")})
    else:
        console.print(f"{run} pinned: retention and gc leave it alone")


@runs_app.command("unpin")
def runs_unpin(run: str = RUN, as_json: bool = JSON) -> None:
    """Let retention rules apply to a run again."""
    marks = service().pin_run(run, False)
    if as_json:
        print_json({"run": run, **marks.model_dump(mode="json")})
    else:
        console.print(f"{run} unpinned: retention rules apply to it again")


def gc(dry_run: bool = DRY_RUN, as_json: bool = JSON) -> None:
    """Apply the retention rules now, and remove what nothing refers to any more.

    \b
    Rules: a server's come from the `storage:` section of its config file (its gc loop
    applies them every `gc_every_s` anyway); embedded, from ORBIT_STORAGE_CONFIG, else
    $ORBIT_HOME/storage.yaml:
      retention:
        keep_checkpoints: 3        # the newest N checkpoints of each run
        artifacts_days: 30         # artifacts of runs ended more than D days ago
        experiments:
          sweeps: {artifacts_days: 7}
          baselines: {artifacts_days: null}   # kept for good
    Pinned runs are never touched; bundles stay while a run that is not deleted uses them.
    Over a server: admins only."""
    report_removals(service().collect_garbage(dry_run=dry_run), as_json)


def usage(as_json: bool = JSON) -> None:
    """Bytes on the control plane by user and by experiment: artifacts (each attempt's copy)
    and bundles (counted for the run that first froze them)."""
    found = service().usage()
    if as_json:
        print_json(found.model_dump(mode="json"))
        return
    from orbit.cli.render import table
    from orbit.core.storage.disk import human

    for title, rows in (("USER", found.users), ("EXPERIMENT", found.experiments)):
        out = table(title, "RUNS", "ARTIFACTS", "BUNDLES", "TOTAL")
        for row in rows:
            out.add_row(
                row.name,
                str(row.runs),
                human(row.artifacts_bytes),
                human(row.bundles_bytes),
                human(row.total_bytes),
            )
        console.print(out)
    line = f"in all: {human(found.artifacts_bytes)} of artifacts, {human(found.bundles_bytes)}"
    line += " of bundles"
    if found.other_bytes:
        line += f"; {human(found.other_bytes)} no run claims (`orbit gc` removes it)"
    console.print(line)


def report_removals(report: GcReport, as_json: bool) -> None:
    if as_json:
        print_json(report.model_dump(mode="json"))
        return
    from orbit.cli.render import table
    from orbit.core.storage.disk import human

    if report.removals:
        out = table("WHAT", "WHERE", "PATH", "BYTES", "WHY")
        for r in report.removals:
            size = human(r.bytes) if r.where == "server" else "queued"
            out.add_row(r.kind, r.where, r.path, size, r.why)
        console.print(out)
    here = [r for r in report.removals if r.where == "server"]
    nodes = len(report.removals) - len(here)
    verb = "would remove" if report.dry_run else "removed"
    line = f"{verb} {len(here)} on the server ({human(report.bytes)})"
    if nodes:
        line += f"; {nodes} on nodes (their agents remove them when told)"
    console.print(line if report.removals else f"nothing to remove{' (dry run)' * report.dry_run}")
    for kept in report.kept:
        err.print(f"  kept: {kept}", style="dim")
