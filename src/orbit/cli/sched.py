"""`orbit explain`, `orbit queue`, `orbit quotas`, `orbit sched simulate`: the scheduler's
decisions, in words and figures, and the admin settings that steer it."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from orbit.cli.common import JSON, OUTPUT, RUN, console, emitted, output_format, print_json, service
from orbit.cli.text import Table, paint
from orbit.cli.watching import INTERVAL, WATCH, repeat
from orbit.model.durations import say_duration

quotas_app = typer.Typer(
    help="""GPU quotas: at most N GPUs at once per user or per experiment, and a fair-share
weight. A run over its quota waits (reason `quota`, with the figures); within a tier the
queue goes lowest dominant share first (DRF), weighed by the user's weight. Setting and
removing are for admins.""",
    no_args_is_help=True,
)
sched_app = typer.Typer(
    help="The scheduler's policy: the config in force (config show, config set FILE), and "
    "another one tried on recorded passes before it applies (simulate).",
    no_args_is_help=True,
)

SCOPE = typer.Argument(..., metavar="SCOPE", help="user or experiment.")
NAME = typer.Argument(..., metavar="NAME", help="The user's or experiment's name.")


def explain(
    run: str = RUN,
    replay: bool = typer.Option(
        False,
        "--replay",
        help="Make the decision again from the stored snapshot and scheduler config, and say "
        "whether it comes out byte for byte the same.",
    ),
    as_json: bool = JSON,
) -> None:
    """Why an agent-pool run went where it went, or why it waits.

    \b
    Per node, in figures: what it asked, what is used, what there is; the counts per
    reason over all nodes; the alternative chosen; the snapshot and config it was made
    on. e.g.  0/4 nodes fit: 2 gpu model (need H100, have A100-40GB); 1 draining; 1 offline 45 s
    """
    from orbit.scheduler.explain import lines

    found = service().explain(run, replay)
    if as_json:
        print_json(found.model_dump(mode="json"))
        return
    for line in lines(found.decision):
        console.print(line)
    if replay:
        same = "identical" if found.replay_identical else "DIFFERENT"
        console.print(f"  replay: {paint(same, 'bold')} (pass {found.pass_id})")
        if not found.replay_identical:
            raise typer.Exit(1)


def queue(
    as_json: bool = JSON,
    output: str | None = OUTPUT,
    watch: bool = WATCH,
    interval: float = INTERVAL,
) -> None:
    """Agent-pool runs not launched yet: those waiting to be placed, by tier and position,
    each with its reason as of now, how long it has waited (since its attempt was made), and
    when it may start (STARTS: the soonest the attempts in its way must end by their
    max_runtime_s; ? where one of them has no limit); then (POS -) those in a retry's
    backoff, with its real remaining time, or placed and not started yet; then the runs of any
    placement held on their dependencies (`after:` in the spec; STARTS after them), with the
    runs each still waits for and how those stand."""
    fmt = output_format(as_json, output)
    repeat(lambda: _queue(fmt), watch, interval)


def _queue(fmt: str) -> bool:
    entries = service().queue()
    if emitted(fmt, lambda: [e.model_dump(mode="json") for e in entries], "run"):
        return False
    if not entries:
        console.print("no run is waiting to be placed")
        return False
    from datetime import UTC, datetime

    table = Table("POS", "TIER", "RUN", "WAITED", "STARTS", "REASON")
    now = datetime.now(UTC)
    for e in entries:
        starts = "after deps" if e.outcome == "held" else "?"
        if e.estimated_start is not None:
            ahead = (e.estimated_start - now).total_seconds()
            starts = f"in ~{say_duration(ahead)}" if ahead > 0 else "now"
        if e.position is None and e.outcome != "held":
            starts = "-"  # not in a pass's queue: its reason says what it waits for
        position = "-" if e.position is None else str(e.position)
        table.add_row(position, e.tier, e.run, say_duration(e.waited_s), starts, e.reason)
    console.print(table)
    return False


@quotas_app.command("list")
def quotas_list(as_json: bool = JSON) -> None:
    """The quotas set, per user and per experiment."""
    quotas = service().list_quotas()
    if as_json:
        print_json([q.model_dump(mode="json") for q in quotas])
        return
    if not quotas:
        console.print("no quotas: every user and experiment may use any free GPU")
        return
    table = Table("SCOPE", "NAME", "GPUS", "WEIGHT", "SET BY")
    for q in quotas:
        table.add_row(q.scope, q.name, str(q.gpus), f"{q.weight:g}", q.updated_by)
    console.print(table)


@quotas_app.command("set")
def quotas_set(
    scope: str = SCOPE,
    name: str = NAME,
    gpus: int = typer.Option(..., "--gpus", min=0, help="At most this many GPUs at once."),
    weight: float = typer.Option(1.0, "--weight", min=0.001, help="Fair-share weight."),
    as_json: bool = JSON,
) -> None:
    """Set (or change) a user's or an experiment's GPU quota."""
    _scope(scope)
    quota = service().set_quota(scope, name, gpus, weight)
    if as_json:
        print_json(quota.model_dump(mode="json"))
        return
    console.print(f"{scope} {name}: at most {quota.gpus} GPU(s) at once, weight {quota.weight:g}")


@quotas_app.command("rm")
def quotas_rm(scope: str = SCOPE, name: str = NAME) -> None:
    """Remove a quota: the user or experiment may use any free GPU again."""
    _scope(scope)
    service().remove_quota(scope, name)
    console.print(f"{scope} {name}: no quota")


def _scope(scope: str) -> None:
    if scope not in ("user", "experiment"):
        from orbit.model.errors import InvalidInput

        raise InvalidInput(f"SCOPE: expected user or experiment, not '{scope}'")


@sched_app.command("simulate")
def simulate(
    since: str = typer.Option("7d", "--since", help="How far back: 30m, 12h, 7d."),
    config: Path = typer.Option(
        ..., "--config", exists=False, help="The scheduler config to try (YAML)."
    ),
    as_json: bool = JSON,
) -> None:
    """Replay the recorded scheduler passes under another config (tiers, weights, quotas,
    preemption) and say what would have changed: runs placed elsewhere, placed instead of
    waiting, waiting instead of placed, preempted differently. Nothing is changed."""
    from orbit.model.yamlio import load_yaml_mapping
    from orbit.scheduler.config import config_from_dict

    data = load_yaml_mapping(config)
    config_from_dict(data, str(config))  # its errors name the file, before any replay
    report = service().simulate(_seconds(since), data)
    if as_json:
        print_json(report.model_dump(mode="json"))
        return
    console.print(f"{report.passes} pass(es), {report.decisions} decision(s) replayed")
    for label, runs in (
        ("placed on another node", report.placed_elsewhere),
        ("placed instead of waiting", report.placed_instead_of_waiting),
        ("waiting instead of placed", report.waiting_instead_of_placed),
        ("preempted differently", report.preempted_differently),
    ):
        console.print(f"  {label}: {len(runs)}" + (f"  ({', '.join(runs[:10])})" if runs else ""))
    console.print(f"  unchanged: {report.unchanged}")


def _seconds(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if m is None or float(m.group(1)) <= 0:
        from orbit.model.errors import InvalidInput

        raise InvalidInput(f"--since: expected a duration such as 30m, 12h or 7d, not '{text}'")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
