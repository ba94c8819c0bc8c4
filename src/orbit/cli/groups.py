"""`orbit groups`: the runs a sweep made together (`orbit submit --sweep`), how they stand, and
their best and worst by a metric their tasks log; and the submit of a sweep itself."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from orbit.cli.common import JSON, console, err, print_json, service
from orbit.cli.complete import complete_experiments, complete_groups
from orbit.cli.text import paint

if TYPE_CHECKING:
    from orbit.model.groups import GroupView, RunGroup
    from orbit.model.models import TaskSubmission
    from orbit.model.sweeps import Sweep

groups_app = typer.Typer(
    help="Groups of runs, one per point of a sweep (orbit submit SPEC --sweep KEY=V1,V2).",
    no_args_is_help=True,
)
GROUP = typer.Argument(
    ...,
    metavar="GROUP",
    help="A group id, or a unique prefix of it.",
    autocompletion=complete_groups,
)
POINTS_SHOWN = 5  # points a dry run lists


def submit_group(
    submission: TaskSubmission,
    sweep: Sweep,
    base_dir: Path,
    source: str,
    dry_run: bool,
    wait: bool,
    as_json: bool,
) -> None:
    """`orbit submit` of a spec with a sweep: one run per point, made as one group."""
    from orbit.model.sweeps import sweep_points

    points = sweep_points(submission, sweep, source)  # refused here before anything is sent
    if dry_run:
        plan = service().plan_submission(points[0], base_dir=base_dir, source=source)
        if as_json:
            print_json({"points": [p.point for p in points], "first": plan.job})
            return
        from orbit.cli import render

        render.show_plan(console, plan)
        console.print(f"{len(points)} runs, one per point (the first planned above):")
        for p in points[:POINTS_SHOWN]:
            console.print("  " + _point(p.point))
        if len(points) > POINTS_SHOWN:
            console.print(f"  ... and {len(points) - POINTS_SHOWN} more", style="dim")
        return
    group = service().submit_sweep(submission, sweep, base_dir=base_dir, source=source)
    if wait:
        group = _wait(group)
    if as_json:
        print_json(group.model_dump(mode="json"))
    else:
        _say_made(group)
    if wait and set(group.counts) != {"succeeded"}:
        raise typer.Exit(1)


def _wait(group: RunGroup) -> RunGroup:
    while not group.ended:
        time.sleep(1.0)
        group = service().get_group(group.id)
    return group


def _say_made(group: RunGroup) -> None:
    axes = " x ".join(f"{k}: {_axis_size(group, k)}" for k in group.sweep.grid)
    shape = f" ({axes})" if axes else ""
    console.print(
        f"group {paint(group.id, 'bold')}: {group.size} runs in experiment "
        f"'{group.experiment_name}'{shape}; {_counts(group)}"
    )
    console.print(f"  follow it: orbit groups show {group.id}", style="dim")


def _axis_size(group: RunGroup, key: str) -> int:
    from orbit.model.sweeps import axis_values

    return len(axis_values(group.sweep.grid[key], key))


def _counts(group: RunGroup) -> str:
    return ", ".join(f"{n} {state}" for state, n in group.counts.items()) or "no runs"


def _point(point: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items())


@groups_app.command("list")
def groups_list(
    experiment: str | None = typer.Option(
        None,
        "--experiment",
        "-e",
        help="Only this experiment's groups (name or id).",
        autocompletion=complete_experiments,
    ),
    user: str | None = typer.Option(
        None, "--user", "-u", metavar="USER", help="Only the groups this user made."
    ),
    limit: int = typer.Option(50, "--limit", "-n", min=1, max=1000, help="At most this many."),
    as_json: bool = JSON,
) -> None:
    """Groups, newest first, with their runs counted by state."""
    groups = service().list_groups(experiment=experiment, user=user, limit=limit)
    if as_json:
        print_json([g.model_dump(mode="json") for g in groups])
        return
    from orbit.cli import render

    out = render.table("GROUP", "EXPERIMENT", "USER", "RUNS", "STATES", "KEYS", "CREATED")
    for g in groups:
        out.add_row(
            g.id,
            g.experiment_name,
            g.created_by,
            str(g.size),
            _counts(g),
            ", ".join(g.sweep.keys()),
            render.ago(g.created_at),
        )
    console.print(out)
    if not groups:
        err.print("no groups" + (" match" if experiment or user else " yet"), style="dim")


@groups_app.command("show")
def groups_show(
    group: str = GROUP,
    metric: str | None = typer.Option(
        None,
        "--metric",
        "-m",
        metavar="NAME",
        help="Rank the runs by the newest value of NAME their logging.jsonl holds "
        "(artifacts/**/logging.jsonl: loss, eval_acc, ...).",
    ),
    higher: bool = typer.Option(
        False, "--max", help="Higher is better for --metric (default: lower, as a loss)."
    ),
    as_json: bool = JSON,
) -> None:
    """One group: its sweep, its runs counted by state and, with --metric, its best and
    worst runs.

    \b
    orbit groups show grp-3f2a --metric loss           # lowest loss first
    orbit groups show grp-3f2a --metric eval_acc --max
    orbit runs list --group grp-3f2a                   # its runs
    orbit retry --group grp-3f2a --failed              # its failed runs, again
    """
    view = service().group_view(group, metric=metric, goal="max" if higher else "min")
    if as_json:
        print_json(view.model_dump(mode="json"))
        return
    _show(view)


def _show(view: GroupView) -> None:
    from orbit.cli import render

    g = view.group
    console.print(f"{paint(g.id, 'bold')}  {g.size} runs  {_counts(g)}")
    console.print(
        f"  experiment {g.experiment_name}, by {g.created_by}, {render.ago(g.created_at)}"
    )
    for key, values in g.sweep.grid.items():
        shown = values if isinstance(values, str) else ", ".join(values)
        console.print(f"  grid {key}: {shown}")
    if g.sweep.points:
        console.print(f"  {len(g.sweep.points)} listed points of {', '.join(g.sweep.keys())}")
    if view.metric is None:
        console.print(f"  rank them: orbit groups show {g.id} --metric loss", style="dim")
        return
    if not view.best:
        console.print(f"no run has logged {view.metric} yet", style="dim")
        return
    order = "highest" if view.goal == "max" else "lowest"
    for title, rows in (("best", view.best), ("worst", view.worst)):
        console.print(f"{title} by {view.metric} ({order} first)" if title == "best" else title)
        out = render.table("RUN", "STATE", view.metric.upper(), "STEP", "POINT")
        for s in rows:
            step = "-" if s.step is None else str(s.step)
            out.add_row(s.run, render.styled(s.state), f"{s.value:.6g}", step, _point(s.point))
        console.print(out)
    if view.unscored:
        console.print(f"{view.unscored} runs have not logged {view.metric}", style="dim")
