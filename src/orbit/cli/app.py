"""`orbit`: submit ML jobs as frozen, reproducible runs; watch, cancel, retry and collect them.

State lives in $ORBIT_HOME (default ~/.orbit), or the database named by ORBIT_DATABASE_URL.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import typer
from sqlalchemy.exc import SQLAlchemyError

from orbit import __version__
from orbit.cli import forensics, render
from orbit.cli.common import (
    ATTEMPT,
    JSON,
    RUN,
    SETS,
    bundles_dir,
    console,
    err,
    provenance,
    service,
    settings,
)
from orbit.cli.hosts import hosts_app
from orbit.core.errors import OrbitError, Unreachable
from orbit.core.execution.backends.base import LogLayer
from orbit.core.execution.docker.image_provenance import attempt_images
from orbit.core.execution.sources import is_dirty
from orbit.core.models import RunState
from orbit.core.overrides import parse_overrides
from orbit.core.records import RunRecord
from orbit.core.spec import load_spec, parse_sets, to_submission
from orbit.forensics.progress import Progress

app = typer.Typer(
    help=__doc__,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode="rich",
)
templates_app = typer.Typer(
    help="Execution templates: where and how runs execute.", no_args_is_help=True
)
experiments_app = typer.Typer(help="Experiments: named groups of runs.", no_args_is_help=True)
runs_app = typer.Typer(help="Runs: list them and look at one closely.", no_args_is_help=True)
app.add_typer(templates_app, name="templates")
app.add_typer(experiments_app, name="experiments")
app.add_typer(runs_app, name="runs")
app.add_typer(hosts_app, name="hosts")


def run_json(
    run: RunRecord, progress: Progress | None = None, images: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A run as JSON, with its bundle path and provenance filled in from the local cache
    (and, where given, the container image each attempt ran)."""
    return render.run_json(run, bundles_dir(), progress, provenance(run.bundle_digest), images)


def show_run(
    run: RunRecord, progress: Progress | None = None, images: dict[str, Any] | None = None
) -> None:
    render.show_run(console, run, bundles_dir(), progress, provenance(run.bundle_digest), images)


def version_callback(value: bool) -> None:
    if value:
        print(f"orbit {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=version_callback, is_eager=True, help="Show the version."
    ),
) -> None:
    """Submit ML jobs as frozen, reproducible runs; watch, cancel, retry and collect them."""


# --- templates --------------------------------------------------------------------------------


@templates_app.command("list")
def templates_list(as_json: bool = JSON) -> None:
    """List templates: built-in, then ./execution_templates/, then $ORBIT_HOME/templates/."""
    sources = service().templates.all()
    if as_json:
        render.print_json([{**s.template.model_dump(mode="json"), "path": s.path} for s in sources])
    else:
        console.print(render.templates_table(sources))


@templates_app.command("show")
def templates_show(
    template_id: str = typer.Argument(..., metavar="ID"), as_json: bool = JSON
) -> None:
    """Show one template and the file it was read from."""
    src = service().templates.source(template_id)
    if as_json:
        render.print_json({**src.template.model_dump(mode="json"), "path": src.path})
        return
    console.print(f"# from {src.path}", style="dim")
    console.print(Path(src.path).read_text(encoding="utf-8"), markup=False)


# --- experiments ------------------------------------------------------------------------------


@experiments_app.command("create")
def experiments_create(name: str, as_json: bool = JSON) -> None:
    """Create an experiment (submitting to an unknown one creates it too)."""
    experiment = service().create_experiment(name)
    if as_json:
        render.print_json(experiment.model_dump(mode="json"))
    else:
        console.print(f"created experiment {experiment.name} ({experiment.id})")


@experiments_app.command("list")
def experiments_list(as_json: bool = JSON) -> None:
    """List experiments with their run counts."""
    experiments = service().list_experiments()
    if as_json:
        render.print_json([e.model_dump(mode="json") for e in experiments])
    else:
        console.print(render.experiments_table(experiments))


# --- submit and runs --------------------------------------------------------------------------


def finish(run_id: str, wait: bool, as_json: bool) -> None:
    svc = service()
    run = svc.get_run(run_id)
    if wait:
        if not as_json:
            err.print(f"waiting for {run.id} (Ctrl-C stops waiting, not the run)...")
        run = svc.wait_for(run.id)
    if as_json:
        render.print_json(run_json(run))
    else:
        show_run(run)
    if wait and run.state is not RunState.SUCCEEDED:
        raise typer.Exit(1)


@app.command()
def submit(
    spec_file: Path = typer.Argument(
        ..., metavar="SPEC.yaml", help="experiment, task_type, template, task, overrides, retry."
    ),
    sets: list[str] = SETS,
    wait: bool = typer.Option(
        False, "--wait", help="Wait until the run ends; exit 1 unless it succeeded."
    ),
    allow_dirty: bool = typer.Option(
        False,
        "--allow-dirty",
        help="Stage git sources with uncommitted changes; the diff is kept in the bundle and "
        "the run is marked dirty.",
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
    """
    spec = load_spec(spec_file, sets)
    submission = to_submission(spec, str(spec_file), allow_dirty)
    run = service().submit_task(
        submission, base_dir=spec_file.resolve().parent, source=str(spec_file)
    )
    wait = wait or run.request.get("detach") is False  # a template may ask to stay attached
    if not as_json and not wait:
        console.print(
            f"submitted [bold]{run.id}[/bold] ({run.state}); bundle {run.bundle_digest[:12]}"
        )
        console.print(f"  follow it: orbit logs {run.id} --follow", style="dim")
        return
    finish(run.id, wait, as_json)


def parse_states(values: list[str]) -> set[RunState]:
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
    runs = service().list_runs(experiment=experiment, states=parse_states(state), limit=limit)
    if as_json:
        render.print_json([run_json(r) for r in runs])
    else:
        dirty = {r.id for r in runs if is_dirty(provenance(r.bundle_digest))}
        console.print(render.runs_table(runs, dirty))


@runs_app.command("show")
def runs_show(run: str = RUN, as_json: bool = JSON) -> None:
    """Everything about one run: its bundle, request, progress and every attempt."""
    record = service().refresh_run_status(run)
    progress = service().progress(record)
    images = attempt_images(service().execution, record)
    if as_json:
        render.print_json(run_json(record, progress, images))
    else:
        show_run(record, progress, images)


@app.command()
def status(run: str = RUN, as_json: bool = JSON) -> None:
    """Refresh a run's state from where it executes, and show it with its latest step/loss."""
    record = service().refresh_run_status(run)
    progress = service().progress(record)
    if as_json:
        render.print_json(run_json(record, progress))
        return
    a = record.current
    line = f"{record.id}  {render.styled(record.state)}  attempt {a.number}"
    if render.outcome(a):
        line += f"  {render.outcome(a)}"
    if is_dirty(provenance(record.bundle_digest)):
        line += "  [yellow]DIRTY code[/yellow]"
    console.print(line)
    if progress is not None:
        console.print(f"  {progress.describe()}", markup=False)
    if a.message:
        console.print(f"  {a.message}", markup=False)


@app.command()
def logs(
    run: str = RUN,
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the run ends."),
    layer: LogLayer = typer.Option(
        LogLayer.TRAINING,
        "--layer",
        "-l",
        help="training: the task's output; runtime: the wrapper's own steps.",
    ),
    attempt: int | None = ATTEMPT,
) -> None:
    """Print a run's logs. With --follow, stream them until the run ends (it follows retries)."""
    svc = service()
    out = sys.stdout.buffer
    offset, current, ending, lost = 0, None, False, False
    written = 0  # by the current read: a read broken off part way goes on from there

    def sink(data: bytes) -> None:
        nonlocal written
        out.write(data)
        written += len(data)

    while True:
        written = 0
        try:  # the rest of the log, streamed (over SSH: one call, not one per chunk)
            chunk = svc.stream_log(run, layer, offset, sink, attempt, only_attempt=current)
        except Unreachable as exc:
            offset += written
            if not follow:
                raise
            if not lost:  # say it once; go on from the same offset when the host is back
                err.print(f"orbit: {exc}; retrying (Ctrl-C stops following)", markup=False)
                lost = True
            if svc.refresh_run_status(run).current.state.terminal and attempt is None:
                return  # gave up on the host: the run ended as host_unreachable
            time.sleep(2)
            continue
        if lost:
            err.print("orbit: reconnected; the log goes on", markup=False)
            lost = False
        if current is not None and chunk.attempt.id != current:  # an automatic retry began
            out.write(f"--- attempt {chunk.attempt.number} ---\n".encode())
            offset, ending = 0, False
            current = chunk.attempt.id
            continue
        current = chunk.attempt.id
        out.flush()
        got, offset = chunk.offset != offset, chunk.offset
        if not follow or ending:  # a read goes to the log's end: nothing more to ask for
            return
        if got:
            continue
        record = svc.refresh_run_status(run)
        followed = next(a for a in record.attempts if a.id == current)
        # the current attempt is followed into retries; an earlier one only to its own end
        if followed.state.terminal and (attempt is not None or record.current.id == current):
            ending = True  # one more read: what was written just before the end
            continue
        time.sleep(0.5)


@app.command()
def cancel(run: str = RUN, as_json: bool = JSON) -> None:
    """Stop a run gracefully (SIGTERM, then SIGKILL after the template's stop_grace_s). Of an
    ended run, what still runs (a host given up on that came back) is stopped."""
    before = service().get_run(run)
    if before.state.terminal:
        stopped, record = service().stop_leftovers(run), before
    else:
        stopped, record = 0, service().cancel_run(run)
    if as_json:
        render.print_json(run_json(record) | {"leftovers_stopped": stopped})
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


@app.command()
def retry(
    run: str = RUN,
    sets: list[str] = SETS,
    wait: bool = typer.Option(
        False, "--wait", help="Wait until the run ends; exit 1 unless it succeeded."
    ),
    as_json: bool = JSON,
) -> None:
    """Run the same bundle again as a new attempt, e.g. on another box: --set target=h100-b."""
    overrides = parse_overrides(parse_sets(sets), "--set")
    record = service().retry_run(run, overrides)
    if not as_json and not wait:
        console.print(f"{record.id}: attempt {record.current.number} {render.styled(record.state)}")
        return
    finish(record.id, wait, as_json)


@app.command()
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
    overrides = parse_overrides(parse_sets(sets), "--set")
    record = service().replay_run(run, overrides)
    if not as_json and not wait:
        console.print(
            f"replaying {record.replay_of} as [bold]{record.id}[/bold] ({record.state}); "
            f"bundle {record.bundle_digest[:12]}"
        )
        return
    finish(record.id, wait, as_json)


@app.command()
def collect(
    run: str = RUN,
    dest: Path | None = typer.Option(
        None, "--dest", "-d", help="Where to put them (default ./orbit-artifacts/ATTEMPT_ID)."
    ),
    attempt: int | None = ATTEMPT,
    as_json: bool = JSON,
) -> None:
    """Copy a run's artifacts here and verify each file against its manifest."""
    record = service().get_run(run)
    number = attempt or record.current.number
    target = dest or Path("orbit-artifacts") / f"{record.id}-{number}"
    if target.exists() and not target.is_dir():
        raise OrbitError(f"--dest {target}: exists and is not a folder")
    result = service().collect_run_artifacts(record.id, target, number)
    if as_json:
        render.print_json(
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
            err.print(f"  {problem}", markup=False)
    if result.problems:
        raise typer.Exit(1)


audit_app = typer.Typer(invoke_without_command=True, rich_markup_mode="rich")
app.add_typer(audit_app, name="audit")


@audit_app.callback()
def audit(
    ctx: typer.Context,
    run: str | None = typer.Option(None, "--run", "-r", help="Only events of this run."),
    limit: int | None = typer.Option(None, "--limit", "-n", min=1, help="Only the newest N."),
    as_json: bool = JSON,
) -> None:
    """The audit trail: who did what to which run, and when. Each event holds the digest of
    the one before it, so a changed, removed or inserted event breaks the chain.

    orbit audit [--run RUN] [--limit N] [--json]   list the events
    orbit audit verify                             check the chain; exit 1 naming each problem
    orbit audit export --json [--out FILE]         write the whole chain, hashes included
    """
    if ctx.invoked_subcommand is not None:
        return
    events = service().audit(run, limit)
    if as_json:
        render.print_json([e.model_dump(mode="json") for e in events])
    else:
        console.print(render.audit_table(events))


@audit_app.command("verify")
def audit_verify(as_json: bool = JSON) -> None:
    """Check the hash chain: each event's digest and its link to the one before.

    Prints the count and the head digest (keep it elsewhere: a chain cut short at its end is
    still whole) and exits 0; or one line per problem on stderr, naming the event, and exits 1.
    """
    check = service().verify_audit()
    if as_json:
        render.print_json(
            {
                "intact": check.intact,
                "events": check.events,
                "head": check.head,
                "problems": list(check.problems),
            }
        )
    elif check.intact:
        console.print(f"audit chain intact: {check.events} events", soft_wrap=True)
        if check.head:
            console.print(f"head: {check.head}", soft_wrap=True)
    else:
        for problem in check.problems:
            err.print(problem, markup=False, soft_wrap=True)
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
        render.print_json(data)
        return
    import json

    out.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    console.print(f"exported {len(data)} events to {out}", markup=False, soft_wrap=True)


app.command("inspect")(forensics.inspect)
app.command("diff")(forensics.diff)


def main() -> None:
    try:
        app()
    except OrbitError as exc:
        fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except SQLAlchemyError as exc:  # the store cannot be reached or read
        url = settings().database_url
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        fail(f"the store at {url} failed: {first} (check ORBIT_DATABASE_URL / ORBIT_HOME)", 2)
    except OSError as exc:  # the disk or the system said no: say what, not where in ORBIT
        fail(f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}", 1)


def fail(message: str, code: int) -> None:
    err.print(f"orbit: error: {message}", markup=False, highlight=False, soft_wrap=True)
    sys.exit(code)
