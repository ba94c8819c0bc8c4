"""`orbit cancel` and `orbit retry`: one run as always, or many at once, by ids or by a filter
(--experiment, --group, --state, --user), with a report of what became of each."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

from orbit.cli.common import (
    JSON,
    SETS,
    console,
    err,
    print_json,
    service,
)
from orbit.cli.complete import complete_experiments, complete_groups, complete_runs
from orbit.cli.runs import WAIT, overrides_from, parse_states, show
from orbit.cli.text import Table, paint

if TYPE_CHECKING:
    from orbit.model.bulk import BulkResult, RunSelection

CONFIRM_ABOVE = 1  # a filter that would act on more runs than this asks first (or --yes)
RUNS = typer.Argument(
    None, metavar="RUN", help="Run ids, or unique prefixes of them.", autocompletion=complete_runs
)
EXPERIMENT = typer.Option(
    None,
    "--experiment",
    "-e",
    metavar="EXPERIMENT",
    help="Every run of this experiment (name or id).",
    autocompletion=complete_experiments,
)
STATE = typer.Option(
    [],
    "--state",
    "-s",
    metavar="STATE",
    help="Every run in this state (repeatable); filters given together must all match.",
)
USER = typer.Option(None, "--user", "-u", metavar="USER", help="Every run this user made.")
GROUP = typer.Option(
    None,
    "--group",
    "-g",
    metavar="GROUP",
    help="Every run of this group, the runs one sweep made (orbit groups list).",
    autocompletion=complete_groups,
)
DRY_RUN = typer.Option(False, "--dry-run", help="List what would be done; do nothing.")
YES = typer.Option(
    False, "--yes", "-y", help="Act on every run a filter matches without asking first."
)
WORDS = {
    "cancelled": "cancelled",
    "retried": "retried",
    "already_ended": "already ended",
    "not_ended": "not ended",
    "refused": "refused",
    "failed": "failed",
    "would_cancel": "would cancel",
    "would_retry": "would retry",
}
STYLE = {"refused": "red", "failed": "red", "cancelled": "yellow", "retried": "green"}


def cancel(
    runs: list[str] | None = RUNS,
    experiment: str | None = EXPERIMENT,
    group: str | None = GROUP,
    state: list[str] = STATE,
    user: str | None = USER,
    dry_run: bool = DRY_RUN,
    yes: bool = YES,
    as_json: bool = JSON,
) -> None:
    """Stop runs gracefully (SIGTERM, then SIGKILL after the template's stop_grace_s).

    \b
    orbit cancel RUN                       # waits for the stop; of an ended run, stops
                                           # what is left of it (a host that came back)
    orbit cancel RUN1 RUN2 ...             # many: asks each to stop, does not wait
    orbit cancel --experiment sweep --state running [--user mia] [--dry-run] [--yes]
    orbit cancel --group grp-3f2a                # every run a sweep made that has not ended

    Many runs: each is reported cancelled, already ended, refused (a member controls only
    its own runs) or failed, then counted; exit 1 if any was refused or failed. A filter that
    would cancel more than one run asks first (without a terminal: give --yes), and then
    acts on exactly the runs it listed.
    """
    selection = _selection(runs or [], experiment, group, state, user)
    if len(selection.ids) == 1 and not dry_run:
        _cancel_one(selection.ids[0], as_json)
        return
    _bulk("cancel", selection, dry_run, yes, as_json)


def retry(
    runs: list[str] | None = RUNS,
    experiment: str | None = EXPERIMENT,
    group: str | None = GROUP,
    state: list[str] = STATE,
    failed: bool = typer.Option(False, "--failed", help="The runs that failed (--state failed)."),
    user: str | None = USER,
    sets: list[str] = SETS,
    wait: bool = WAIT,
    dry_run: bool = DRY_RUN,
    yes: bool = YES,
    as_json: bool = JSON,
) -> None:
    """Run the same bundle again as a new attempt (on another box: --set target=h100-b).

    \b
    orbit retry RUN [--set target=h100-b] [--wait]
    orbit retry RUN1 RUN2 ...              # many ended runs, oldest first
    orbit retry --experiment sweep --state failed [--user mia] [--dry-run] [--yes]
    orbit retry --group grp-3f2a --failed        # a sweep's failed runs, each again

    Many runs: each is reported retried, not ended (cancel it first), refused or failed,
    then counted; exit 1 if any was refused or failed. --set and --wait take one run. A
    filter that would retry more than one run asks first (without a terminal: --yes).
    """
    from orbit.model.errors import InvalidInput

    states = [*state, "failed"] if failed and "failed" not in state else state
    selection = _selection(runs or [], experiment, group, states, user)
    if len(selection.ids) == 1 and not dry_run:
        record = service().retry_run(selection.ids[0], overrides_from(sets))
        if not as_json and not wait:
            from orbit.cli import render

            state_ = render.styled(record.state)
            console.print(f"{record.id}: attempt {record.current.number} {state_}")
            return
        show(record.id, wait, as_json)
        return
    if sets or wait:
        raise InvalidInput("--set and --wait take one run (give one run id)")
    _bulk("retry", selection, dry_run, yes, as_json)


def _selection(
    runs: list[str], experiment: str | None, group: str | None, state: list[str], user: str | None
) -> RunSelection:
    from orbit.model.bulk import RunSelection
    from orbit.model.errors import InvalidInput

    selection = RunSelection(
        ids=tuple(runs),
        experiment=experiment,
        group=group,
        states=tuple(sorted(parse_states(state))),
        user=user,
    )
    if selection.ids and selection.by_filter:
        raise InvalidInput(
            "give run ids or a filter (--experiment, --group, --state, --user), not both"
        )
    if not selection.ids and not selection.by_filter:
        raise InvalidInput(
            "give a run id, several, or a filter (--experiment, --group, --state, --user)"
        )
    return selection


def _cancel_one(run: str, as_json: bool) -> None:
    """One run, as `orbit cancel RUN` always did: wait for the stop; of an ended run, stop
    what still runs of it."""
    from orbit.cli import render

    svc = service()
    before = svc.get_run(run)
    if before.state.terminal:
        stopped, record = svc.stop_leftovers(run), before
    else:
        stopped, record = 0, svc.cancel_run(run)
    if as_json:
        view = svc.run_view(record.id, refresh=False)
        print_json(render.run_json(view) | {"leftovers_stopped": stopped})
    elif before.state.terminal and stopped:
        plural = "es" if stopped != 1 else ""
        console.print(
            f"{record.id} already {record.state}; stopped {stopped} leftover process{plural}"
        )
    elif before.state.terminal:
        console.print(f"{record.id} already {record.state}: nothing to cancel")
    else:
        console.print(
            f"{record.id}: {render.styled(record.state)} {render.outcome(record.current)}"
        )


def _bulk(action: str, selection: RunSelection, dry_run: bool, yes: bool, as_json: bool) -> None:
    svc = service()
    act = svc.cancel_runs if action == "cancel" else svc.retry_runs
    if selection.by_filter and not dry_run and not yes:
        selection = _confirmed(action, act(selection, dry_run=True), as_json)
    result = act(selection, dry_run=dry_run)
    if as_json:
        print_json(result.model_dump(mode="json") | {"counts": result.counts()})
    else:
        _report(result)
    if result.any_failed and not dry_run:
        raise typer.Exit(1)


def _confirmed(action: str, preview: BulkResult, as_json: bool) -> RunSelection:
    """What to act on once the caller agrees: exactly the runs the preview listed. A filter
    that would act on more than CONFIRM_ABOVE runs asks on a terminal; elsewhere it needs
    --yes, and nothing is done without it."""
    from orbit.model.bulk import RunSelection
    from orbit.model.errors import Refused

    would = [i for i in preview.items if i.outcome.value.startswith("would_")]
    if len(would) > CONFIRM_ABOVE:
        said = f"the filter ({preview.selection.describe()}) would {action} {len(would)} runs"
        if not sys.stdin.isatty() or as_json:
            raise Refused(f"{said}: add --yes to do it (--dry-run lists them)")
        err.print(_table(preview))
        if not typer.confirm(f"{said}: go on?", default=False, err=True):
            err.print("nothing done")
            raise typer.Exit(1)
    if not preview.items:
        return preview.selection
    return RunSelection(ids=tuple(i.run for i in preview.items))


def _table(result: BulkResult) -> Table:
    table = Table("RUN", "USER", "STATE", "ATTEMPT", "OUTCOME", "NOTE")
    for item in result.items:
        word = WORDS[item.outcome.value]
        table.add_row(
            item.run,
            item.user,
            item.state.value,
            str(item.attempt or "-"),
            paint(word, STYLE.get(item.outcome.value, "")),
            item.message,
        )
    return table


def _report(result: BulkResult) -> None:
    if not result.items:
        console.print(f"no runs match {result.selection.describe()}: nothing to {result.action}")
        return
    console.print(_table(result))
    counts = ", ".join(f"{n} {WORDS[o]}" for o, n in result.counts().items())
    lead = "dry run, nothing done" if result.dry_run else result.action
    console.print(f"{lead}: {counts}")
