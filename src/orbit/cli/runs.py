"""`orbit submit`, `runs list|show`, `status`, `replay`, `collect` (`cancel`, `retry`: bulk.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from orbit.cli.common import (
    ATTEMPT,
    JSON,
    OUTPUT,
    RUN,
    SETS,
    console,
    emitted,
    err,
    output_format,
    print_json,
    service,
)
from orbit.cli.complete import (
    complete_experiments,
    complete_groups,
    complete_nodes,
    complete_runs,
    complete_templates,
)
from orbit.cli.text import paint
from orbit.cli.watching import INTERVAL, WATCH, repeat

if TYPE_CHECKING:
    from orbit.model.models import ExecutionOverrides, RunState

runs_app = typer.Typer(help="Runs: list them and look at one closely.", no_args_is_help=True)
WAIT = typer.Option(False, "--wait", help="Wait until the run ends; exit 1 unless it succeeded.")


def show(ref: str, wait: bool, as_json: bool) -> None:
    """Print a run just launched (after waiting for its end, if asked), as the store has it:
    no more contact with where it runs; exit 1 if waited for and it did not succeed."""
    from orbit.cli import render

    svc = service()
    if wait:
        if not as_json:
            err.print(f"waiting for {ref} (Ctrl-C stops waiting, not the run)...")
        svc.wait_for(ref)
    view = svc.run_view(ref, refresh=False)
    if as_json:
        print_json(render.run_json(view))
    else:
        render.show_run(console, view)
    if wait and view.run.state != "succeeded":
        raise typer.Exit(1)


def submit(
    spec_file: Path = typer.Argument(
        ..., metavar="SPEC.yaml", help="experiment, task_type, template, task, overrides, retry."
    ),
    template: str | None = typer.Option(
        None,
        "--template",
        "-t",
        metavar="NAME",
        autocompletion=complete_templates,
        help="Run with this template instead of the spec's `template:` (see `orbit templates "
        "list`); the spec's overrides and --set are checked against its allow_overrides.",
    ),
    sets: list[str] = SETS,
    wait: bool = WAIT,
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Validate, shape, resolve the template and freeze; print what would run and where "
        "(with --json: the job spec as job.json holds it). Nothing is written to the store.",
    ),
    allow_dirty: bool = typer.Option(
        False,
        "--allow-dirty",
        help="Stage git sources with uncommitted changes; the diff is kept in the bundle and "
        "the run is marked dirty.",
    ),
    queue_anyway: bool = typer.Option(
        False,
        "--queue-anyway",
        help="Queue an agent-pool run even if no registered node could ever hold what it asks "
        "(for nodes yet to join); without it, such a run is refused with the largest node's "
        "figures.",
    ),
    after: list[str] = typer.Option(
        [],
        "--after",
        metavar="RUN",
        autocompletion=complete_runs,
        help="Start only once RUN has succeeded (repeatable; adds to the spec's after.ok). "
        "If it ends otherwise, this run fails (dependency_failed).",
    ),
    after_any: list[str] = typer.Option(
        [],
        "--after-any",
        metavar="RUN",
        autocompletion=complete_runs,
        help="Start only once RUN has ended, however it ended (repeatable; after.any).",
    ),
    sweeps: list[str] = typer.Option(
        [],
        "--sweep",
        metavar="KEY=V1,V2|A..B",
        help="Make a group of runs, one per point of the grid these axes span (repeatable; "
        "added to the spec's sweep.grid): each point's values fill the task's {KEY} "
        "placeholders in task.args, task.command or task.env, and reach it as "
        "ORBIT_SWEEP_<KEY>. A..B is the integers A to B; A..B..STEP skips.",
    ),
    as_json: bool = JSON,
) -> None:
    """Validate a run spec, freeze it into a bundle and start it (or, with a sweep, one
    run per point: see orbit groups).

    \b
    experiment: mnist            # created if unknown
    task_type: python            # or command
    template: local              # see 'orbit templates list'
    task:
      script: train.py           # its folder is staged as the workdir
      args: ["--epochs", "3"]
      critical_imports: [torch]  # checked in the task's interpreter first
      sources:                   # git, pinned to an exact commit
        - {repo: ../my-fork, ref: 0123...(40 hex), path: fork}
    overrides: {resources: {cpu_count: 2}}
    retry: {max_retries: 2, on_exit_codes: [75]}
    priority: normal             # agent pools: urgent | high | normal | batch
    preemptible: false
    after: {ok: [RUN], any: [RUN]}  # start once these succeeded (ok) / ended (any)
    secrets: {HF_TOKEN: hf_token}   # env <- 'orbit secrets set hf_token'; never a value
    sweep: {grid: {lr: [1e-4, 3e-4], seed: 0..4}}  # args: ["--lr", "{lr}", "--seed", "{seed}"]

    \b
    orbit submit spec.yaml --sweep lr=1e-4,3e-4,1e-3 --sweep seed=0..4   # 15 runs, one group
    """
    from orbit.model.spec import add_after, load_spec, to_submission

    spec = add_after(load_spec(spec_file, sets, template), after, after_any)
    submission = to_submission(spec, str(spec_file), allow_dirty, queue_anyway)
    base_dir = spec_file.resolve().parent
    if spec.sweep is not None or sweeps:
        from orbit.cli.groups import submit_group
        from orbit.model.sweeps import with_flags

        sweep = with_flags(spec.sweep, sweeps)
        assert sweep is not None
        submit_group(submission, sweep, base_dir, str(spec_file), dry_run, wait, as_json)
        return
    if dry_run:
        plan = service().plan_submission(submission, base_dir=base_dir, source=str(spec_file))
        if as_json:
            print_json(plan.job)
            return
        from orbit.cli import render

        render.show_plan(console, plan)
        return
    run = service().submit_task(submission, base_dir=base_dir, source=str(spec_file))
    from orbit.cli.render import policy_warnings

    policy_warnings(run.policy)
    wait = wait or not run.request.detach  # a template may ask to stay attached
    if not as_json and not wait:
        console.print(
            f"submitted {paint(run.id, 'bold')} ({run.state}); bundle {run.bundle_digest[:12]}"
        )
        console.print(f"  follow it: orbit logs {run.id} --follow", style="dim")
        return
    show(run.id, wait, as_json)


def parse_states(values: list[str]) -> set[RunState]:
    from orbit.model.errors import OrbitError
    from orbit.model.states import RunState

    states = set()
    for value in values:
        try:
            states.add(RunState(value))
        except ValueError:
            known = ", ".join(s.value for s in RunState)
            raise OrbitError(
                f"--state: unknown state '{value}' (expected one of: {known})"
            ) from None
    return states


@runs_app.command("list")
def runs_list(
    experiment: str | None = typer.Option(
        None,
        "--experiment",
        "-e",
        help="Only this experiment (name or id).",
        autocompletion=complete_experiments,
    ),
    state: list[str] = typer.Option(
        [], "--state", "-s", help="Only runs in this state (repeatable)."
    ),
    user: str | None = typer.Option(
        None, "--user", "-u", metavar="USER", help="Only runs this user submitted."
    ),
    mine: bool = typer.Option(False, "--mine", help="Only runs you submitted."),
    node: str | None = typer.Option(
        None,
        "--node",
        metavar="NODE",
        autocompletion=complete_nodes,
        help="Only runs whose current attempt is there: an agent node, SSH host or Slurm "
        "cluster, by name (or the node a run waits for, pinned).",
    ),
    group: str | None = typer.Option(
        None,
        "--group",
        "-g",
        metavar="GROUP",
        help="Only the runs a sweep made (orbit groups list).",
        autocompletion=complete_groups,
    ),
    limit: int = typer.Option(50, "--limit", "-n", min=1, help="At most this many, newest first."),
    as_json: bool = JSON,
    output: str | None = OUTPUT,
    watch: bool = WATCH,
    interval: float = INTERVAL,
) -> None:
    """List runs, newest first: who submitted each (USER), where its current attempt runs
    (WHERE: node, host or cluster) and, for one not launched yet, what it waits for. Runs
    still active are refreshed from the execution plane. -o wide adds each run's bundle and
    when it was created, in full."""
    fmt = output_format(as_json, output)
    args = (experiment, state, user, mine, node, group, limit, fmt)
    repeat(lambda: _runs_list(*args), watch, interval)


def _runs_list(
    experiment: str | None,
    state: list[str],
    user: str | None,
    mine: bool,
    node: str | None,
    group: str | None,
    limit: int,
    fmt: str,
) -> bool:
    page = service().run_page(
        experiment=experiment,
        states=parse_states(state),
        limit=limit,
        user=user,
        node=node,
        mine=mine,
        group=group,
    )
    from orbit.cli import render

    if emitted(fmt, lambda: [render.run_json(v) for v in page.runs]):
        return False
    console.print(render.runs_table(page.runs, wide=fmt == "wide"))
    if page.total > len(page.runs):
        err.print(
            f"{len(page.runs)} of {page.total:,} runs (newest first; --limit N for more)",
            style="dim",
        )
    elif not page.runs:
        filtered = state or experiment or user or mine or node or group
        err.print("no runs" + (" match" if filtered else " yet"), style="dim")
    return False


@runs_app.command("show")
def runs_show(run: str = RUN, as_json: bool = JSON) -> None:
    """Everything about one run: its bundle, request, progress and every attempt."""
    from orbit.cli import render

    view = service().run_view(run, images=True)
    if as_json:
        print_json(render.run_json(view))
    else:
        render.show_run(console, view)


def status(
    run: str = RUN, as_json: bool = JSON, watch: bool = WATCH, interval: float = INTERVAL
) -> None:
    """Refresh a run's state from where it executes, and show it: where it runs (node, host
    or cluster), who submitted it, its latest step/loss, or what it waits for. --watch shows
    it again until the run ends."""
    repeat(lambda: _status(run, as_json), watch, interval)


def _status(run: str, as_json: bool) -> bool:
    from orbit.cli import render

    view = service().run_view(run)
    if as_json:
        print_json(render.run_json(view))
        return view.run.state.terminal
    record, a = view.run, view.run.current
    line = f"{record.id}  {render.styled(record.state)}  attempt {a.number}"
    if a.where is not None:
        line += f"  on {render.where(a)}"
    line += f"  by {record.created_by}"
    said = render.outcome(a, view.wait)
    if said:
        line += f"  {said}"
    if view.dirty:
        line += "  " + paint("DIRTY code", "yellow")
    console.print(line)
    if view.progress is not None:
        console.print(f"  {view.progress.describe()}")
    if a.message and view.wait is None:  # a wait says what it waits for as of now
        console.print(f"  {a.message}")
    return record.state.terminal


def overrides_from(sets: list[str]) -> ExecutionOverrides:
    from orbit.model.overrides import parse_overrides
    from orbit.model.spec import parse_sets

    return parse_overrides(parse_sets(sets), "--set")


def replay(
    run: str = RUN,
    sets: list[str] = SETS,
    wait: bool = typer.Option(
        False, "--wait", help="Wait until the new run ends; exit 1 unless it succeeded."
    ),
    as_json: bool = JSON,
) -> None:
    """Start a NEW run from the same bundle (the original stays as it is), e.g. to reproduce
    it elsewhere: --set target=h100-b. The new run records which run it replays."""
    record = service().replay_run(run, overrides_from(sets))
    if not as_json and not wait:
        console.print(
            f"replaying {record.replay_of} as {paint(record.id, 'bold')} ({record.state}); "
            f"bundle {record.bundle_digest[:12]}"
        )
        return
    show(record.id, wait, as_json)


def collect(
    run: str = RUN,
    dest: Path | None = typer.Option(
        None, "--dest", "-d", help="Where to put them (default ./orbit-artifacts/RUN-ATTEMPT)."
    ),
    attempt: int | None = ATTEMPT,
    as_json: bool = JSON,
) -> None:
    """Copy a run's artifacts here and verify each file against its manifest. Incremental:
    only files DEST lacks (or has otherwise) move, so a second collect of unchanged artifacts
    moves 0 bytes; a transfer cut short goes on from where it stopped when run again (its
    state: DEST/.orbit-collect/). Says what retention removed, and the bytes moved."""
    from orbit.model.errors import OrbitError

    svc = service()
    record = svc.get_run(run)
    number = attempt or record.current.number
    target = dest or Path("orbit-artifacts") / f"{record.id}-{number}"
    if target.exists() and not target.is_dir():
        raise OrbitError(f"--dest {target}: exists and is not a folder")
    result = svc.collect_run_artifacts(record.id, target, number)
    if as_json:
        print_json(
            {
                "dest": str(result.dest),
                "files": result.files,
                "bytes": result.bytes,
                "moved": result.moved,
                "verified": result.verified,
                "problems": list(result.problems),
                "removed": list(result.removed),
            }
        )
    else:
        note = "verified against manifest.json" if result.verified else "NOT verified"
        console.print(
            f"{result.files} files, {result.bytes} bytes ({result.moved} moved) -> "
            f"{result.dest} ({note})"
        )
        for removed in result.removed:
            err.print(f"  {removed}", style="dim")
        for problem in result.problems:
            err.print(f"  {problem}")
    if result.problems:
        raise typer.Exit(1)
