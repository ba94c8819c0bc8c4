"""`orbit inspect` and `orbit diff`: reading what runs left behind."""

from __future__ import annotations

import typer

from orbit.cli.common import ATTEMPT, JSON, RUN, console, print_json, service
from orbit.cli.complete import complete_runs
from orbit.cli.text import paint

VERDICT_STYLE = {  # by orbit.forensics.diagnose.Verdict
    "ok": "green",
    "failed": "bold red",
    "warning": "yellow",
    "pending": "cyan",
    "absent": "dim",
}


def inspect(run: str = RUN, attempt: int | None = ATTEMPT, as_json: bool = JSON) -> None:
    """Walk the layered logs (runtime, precheck, training, progress, nvml) and say at which
    layer the run first went wrong."""
    found = service().inspect_run(run, attempt)
    if as_json:
        data = found.model_dump(mode="json")
        data["first_wrong"] = found.first_wrong.layer if found.first_wrong else None
        print_json(data)
        return
    console.print(f"{paint(found.run_id, 'bold')} attempt {found.attempt}  {found.state}")
    for report in found.layers:
        style = VERDICT_STYLE[report.verdict]
        console.print(
            f"  {paint(f'{report.verdict:<8}', style)} {paint(f'{report.layer:<9}', 'bold')}"
            f" {report.question}"
        )
        console.print(f"           {report.summary}")
        for line in report.details:
            console.print(f"             | {line}", style="dim")
    first = found.first_wrong
    if first is not None:
        console.print(f"first went wrong at: {paint(first.layer, 'bold red')} ({first.summary})")
    elif found.state.terminal:
        console.print("no layer reports a failure")


def diff(
    run_a: str = typer.Argument(..., metavar="RUN_A", autocompletion=complete_runs),
    run_b: str = typer.Argument(..., metavar="RUN_B", autocompletion=complete_runs),
    as_json: bool = JSON,
) -> None:
    """What differs between two runs: task request, template and overrides, env (secret
    values never shown), dependency versions and paths, git commits, GPUs, host."""
    from orbit.cli import render

    found = service().diff_runs(run_a, run_b)
    a, b, differences = found.a, found.b, found.differences
    if as_json:
        print_json({"a": a, "b": b, "differences": [d.model_dump() for d in differences]})
        return
    if not differences:
        console.print(f"{a} and {b}: no differences")
        return
    table = render.table("FIELD", a, b)
    for d in differences:
        table.add_row(d.key, d.a or "-", d.b or "-")
    console.print(table)
