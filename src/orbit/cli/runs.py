"""`orbit submit`, `runs list|show`, `status`, `cancel`, `retry`, `replay`, `collect`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from orbit.cli.common import ATTEMPT, JSON, RUN, SETS, console, err, print_json, service
from orbit.cli.text import paint

if TYPE_CHECKING:
    from orbit.core.models import ExecutionOverrides, RunState

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
    as_json: bool = JSON,
) -> None:
    """Validate a run spec, freeze it into a bundle and start it.

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
    """
    from orbit.core.spec import load_spec, to_submission

    spec = load_spec(spec_file, sets)
    submission = to_submission(spec, str(spec_file), allow_dirty, queue_anyway)
    base_dir = spec_file.resolve().parent
    if dry_run:
        plan = service().plan_submission(submission, base_dir=base_dir, source=str(spec_file))
        if as_json:
            print_json(plan.job)
            return
        from orbit.cli import render

        render.show_plan(console, plan)
        return
    run = service().submit_task(submission, base_dir=base_dir, source=str(spec_file))
    wait = wait or run.request.get("detach") is False  # a template may ask to stay attached
    if not as_json and not wait:
        console.print(
            f"submitted {paint(run.id, 'bold')} ({run.state}); bundle {run.bundle_digest[:12]}"
        )
        console.print(f"  follow it: orbit logs {run.id} --follow", style="dim")
        return
    show(run.id, wait, as_json)


def parse_states(values: list[str]) -> set[RunState]:
    from orbit.core.errors import OrbitError
    from orbit.core.states import RunState

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
        None, "--experiment", "-e", help="Only this experiment (name or id)."
    ),
    state: list[str] = typer.Option(
        [], "--state", "-s", help="Only runs in this state (repeatable)."
    ),
    limit: int = typer.Option(50, "--limit", "-n", min=1, help="At most this many, newest first."),
    as_json: bool = JSON,
) -> None:
    """List runs, newest first. Runs still active are refreshed from the execution plane."""
    page = service().run_page(experiment=experiment, states=parse_states(state), limit=limit)
    from orbit.cli import render

    if as_json:
        print_json([render.run_json(v) for v in page.runs])
        return
    console.print(render.runs_table(page.runs))
    if page.total > len(page.runs):
        err.print(
            f"{len(page.runs)} of {page.total:,} runs (newest first; --limit N for more)",
            style="dim",
        )
    elif not page.runs:
        err.print("no runs" + (" match" if state or experiment else " yet"), style="dim")


@runs_app.command("show")
def runs_show(run: str = RUN, as_json: bool = JSON) -> None:
    """Everything about one run: its bundle, request, progress and every attempt."""
    from orbit.cli import render

    view = service().run_view(run, images=True)
    if as_json:
        print_json(render.run_json(view))
    else:
        render.show_run(console, view)


def status(run: str = RUN, as_json: bool = JSON) -> None:
    """Refresh a run's state from where it executes, and show it with its latest step/loss."""
    from orbit.cli import render

    view = service().run_view(run)
    if as_json:
        print_json(render.run_json(view))
        return
    record, a = view.run, view.run.current
    line = f"{record.id}  {render.styled(record.state)}  attempt {a.number}"
    if render.outcome(a):
        line += f"  {render.outcome(a)}"
    if view.dirty:
        line += "  " + paint("DIRTY code", "yellow")
    console.print(line)
    if view.progress is not None:
        console.print(f"  {view.progress.describe()}")
    if a.message:
        console.print(f"  {a.message}")


def cancel(run: str = RUN, as_json: bool = JSON) -> None:
    """Stop a run gracefully (SIGTERM, then SIGKILL after the template's stop_grace_s). Of an
    ended run, what still runs (a host given up on that came back) is stopped."""
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


def overrides_from(sets: list[str]) -> ExecutionOverrides:
    from orbit.core.overrides import parse_overrides
    from orbit.core.spec import parse_sets

    return parse_overrides(parse_sets(sets), "--set")


def retry(run: str = RUN, sets: list[str] = SETS, wait: bool = WAIT, as_json: bool = JSON) -> None:
    """Run the same bundle again as a new attempt (on another box: --set target=h100-b)."""
    from orbit.cli import render

    record = service().retry_run(run, overrides_from(sets))
    if not as_json and not wait:
        console.print(f"{record.id}: attempt {record.current.number} {render.styled(record.state)}")
        return
    show(record.id, wait, as_json)


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
    """Copy a run's artifacts here and verify each file against its manifest."""
    from orbit.core.errors import OrbitError

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
                "verified": result.verified,
                "problems": list(result.problems),
            }
        )
    else:
        note = "verified against manifest.json" if result.verified else "NOT verified"
        console.print(f"{result.files} files, {result.bytes} bytes -> {result.dest} ({note})")
        for problem in result.problems:
            err.print(f"  {problem}")
    if result.problems:
        raise typer.Exit(1)
