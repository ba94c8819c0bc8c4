"""Turning records into tables, detail views and JSON. Sentences are made here, at the edge."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from orbit.core.execution.docker.image_provenance import image_line
from orbit.core.execution.sources import is_dirty
from orbit.core.models import RunState
from orbit.core.records import AttemptRecord, AuditEvent, ExperimentRecord, RunRecord
from orbit.core.templates import TemplateSource
from orbit.forensics.progress import Progress

STATE_STYLE = {
    RunState.SUCCEEDED: "green",
    RunState.FAILED: "red",
    RunState.TERMINATED: "yellow",
    RunState.RUNNING: "cyan",
}


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=False, default=str))


def when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone().strftime("%m-%d %H:%M:%S")


def ago(value: datetime | None) -> str:
    if value is None:
        return "-"
    seconds = int((datetime.now(UTC) - value).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{max(seconds, 0)}s ago"


def styled(state: RunState) -> str:
    style = STATE_STYLE.get(state)
    return f"[{style}]{state}[/{style}]" if style else str(state)


def outcome(attempt: AttemptRecord) -> str:
    parts = []
    if attempt.reason is not None:
        parts.append(f"{attempt.reason} ({attempt.reason.kind})")
    if attempt.exit_code is not None:
        parts.append(f"exit {attempt.exit_code}")
    if attempt.unreachable and attempt.last_contact_at is not None:
        parts.append(f"last contact {attempt.last_contact_at:%Y-%m-%d %H:%M:%S} UTC")
    return ", ".join(parts)


def attempt_json(a: AttemptRecord) -> dict[str, Any]:
    data = a.model_dump(mode="json")
    data["failure_kind"] = a.reason.kind.value if a.reason else None
    return data


def provenance_line(provenance: dict[str, Any] | None) -> str | None:
    """One line on where the code came from; DIRTY first, wherever it is shown."""
    if not provenance:
        return None
    parts = []
    workdir = provenance.get("workdir")
    if workdir:
        parts.append(
            f"workdir @ {str(workdir.get('commit'))[:12]}"
            + (" (dirty)" if workdir.get("dirty") else "")
        )
    for source in provenance.get("sources", []):
        parts.append(
            f"{source.get('path')} @ {str(source.get('commit'))[:12]}"
            + (" (dirty)" if source.get("dirty") else "")
        )
    return ("DIRTY: " if is_dirty(provenance) else "") + ", ".join(parts)


def run_json(
    run: RunRecord,
    bundles_dir: str,
    progress: Progress | None = None,
    provenance: dict[str, Any] | None = None,
    images: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """`images`: attempt id -> runtime/image.json, for attempts that ran in a container."""
    images = images or {}
    attempts = [attempt_json(a) | {"image": images.get(a.id)} for a in run.attempts]
    return {
        "id": run.id,
        "state": run.state.value,
        "experiment": {"id": run.experiment_id, "name": run.experiment_name},
        "task_type": run.task_type,
        "template_id": run.template_id,
        "bundle": {"digest": run.bundle_digest, "path": f"{bundles_dir}/{run.bundle_digest}"},
        "created_at": run.created_at.isoformat(),
        "created_by": run.created_by,
        "replay_of": run.replay_of,
        "request": run.request,
        "submission": run.submission,
        "attempts": attempts,
        "progress": progress.model_dump(mode="json") if progress else None,
        "provenance": provenance,
        "dirty": is_dirty(provenance),
    }


def runs_table(runs: list[RunRecord], dirty: set[str] | frozenset[str] = frozenset()) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("RUN", "EXPERIMENT", "STATE", "TASK", "TEMPLATE", "TRY", "CREATED", "OUTCOME"):
        # ids and states are what people copy and scan for: never cut them
        table.add_column(
            column, no_wrap=column in ("RUN", "STATE", "TRY", "CREATED"), overflow="fold"
        )
    for run in runs:
        table.add_row(
            run.id,
            run.experiment_name,
            styled(run.state) + (" [yellow]dirty[/yellow]" if run.id in dirty else ""),
            run.task_type,
            run.template_id,
            str(run.current.number),
            ago(run.created_at),
            outcome(run.current),
        )
    return table


def show_run(
    console: Console,
    run: RunRecord,
    bundles_dir: str,
    progress: Progress | None = None,
    provenance: dict[str, Any] | None = None,
    images: dict[str, dict[str, Any]] | None = None,
) -> None:
    a = run.current
    console.print(f"[bold]{run.id}[/bold]  {styled(run.state)}  {outcome(a)}")
    rows = [
        ("experiment", f"{run.experiment_name} ({run.experiment_id})"),
        ("task", run.task_type),
        ("template", run.template_id),
        ("bundle", run.bundle_digest),
        ("cached at", f"{bundles_dir}/{run.bundle_digest}"),
        ("created", f"{when(run.created_at)} by {run.created_by}"),
        ("target", a.target or "-"),
    ]
    code = provenance_line(provenance)
    if code:
        rows.append(("code", code))
    image = image_line((images or {}).get(a.id))
    if image:
        rows.append(("image", image))
    if run.replay_of:
        rows.append(("replays", run.replay_of))
    if a.message:
        rows.append(("message", a.message))
    if progress is not None:
        rows.append(("progress", f"{progress.describe()}  ({progress.file})"))
    if a.handle is not None:
        rows.append(("location", f"{a.handle.target}:{a.handle.location}"))
    for key, value in rows:
        console.print(f"  {key:<10} {value}", highlight=False, markup=False, soft_wrap=True)
    table = Table(box=None, header_style="bold", title="attempts", title_justify="left")
    for column in ("#", "STATE", "TRIGGER", "TARGET", "STARTED", "FINISHED", "OUTCOME"):
        table.add_column(column)
    for attempt in run.attempts:
        table.add_row(
            str(attempt.number),
            styled(attempt.state),
            attempt.trigger,
            attempt.target or "-",
            when(attempt.started_at),
            when(attempt.finished_at),
            outcome(attempt),
        )
    console.print(table)


def templates_table(sources: list[TemplateSource]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("ID", "PLACEMENT", "LAUNCH", "DESCRIPTION"):
        table.add_column(column)
    for src in sources:
        t = src.template
        table.add_row(t.id, t.placement.kind, t.launch_mode.kind, t.description)
    return table


def experiments_table(experiments: list[ExperimentRecord]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("ID", "NAME", "RUNS", "CREATED"):
        table.add_column(column)
    for e in experiments:
        table.add_row(e.id, e.name, str(e.run_count), when(e.created_at))
    return table


def audit_table(events: list[AuditEvent]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("#", "AT", "ACTOR", "ACTION", "RUN", "DETAIL"):
        table.add_column(column)
    for e in events:
        detail = " ".join(f"{k}={v}" for k, v in e.data.items())
        table.add_row(
            str(e.id), when(e.at), e.actor, e.action, e.attempt_id or e.run_id or "-", detail
        )
    return table
