"""Turning records into tables, detail views and JSON. Sentences are made here, at the edge."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Any

from orbit.cli.text import Printer, Table, paint
from orbit.core.control.views import RunView, SecretUse, SubmitPlan, TemplateView, WaitView
from orbit.model.hosts import HostFacts
from orbit.model.models import RunState
from orbit.model.policies import PolicyStamp
from orbit.model.records import AttemptRecord, AuditEvent, ExperimentRecord

STATE_STYLE = {
    RunState.SUCCEEDED: "green",
    RunState.FAILED: "red",
    RunState.TERMINATED: "yellow",
    RunState.RUNNING: "cyan",
}


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
    return paint(str(state), STATE_STYLE.get(state))


def outcome(attempt: AttemptRecord, wait: WaitView | None = None) -> str:
    """How the attempt ended, or, not launched yet, what it waits for (`wait`, made when it
    was read: a backoff's real remaining time, room, a quota; never a stale reason)."""
    parts = []
    if attempt.reason is not None:
        parts.append(f"{attempt.reason} ({attempt.reason.kind})")
    if attempt.exit_code is not None:
        parts.append(f"exit {attempt.exit_code}")
    if attempt.unreachable and attempt.last_contact_at is not None:
        parts.append(f"last contact {attempt.last_contact_at:%Y-%m-%d %H:%M:%S} UTC")
    if wait is not None and attempt.state is RunState.PREPARED:
        from orbit.core.control.waits import reason

        parts.append(reason(wait, datetime.now(UTC)))
    return ", ".join(parts)


def where(attempt: AttemptRecord) -> str:
    """`node gpu-b`, `host h100-a`, `cluster hpc`, `localhost`: where it runs (or is pinned
    to); `-` before it is placed."""
    place = attempt.where
    if place is None:
        return "-"
    kind = attempt.backend_key.split("_", 1)[0]
    word = {"agent": "node", "ssh": "host", "targon": "host", "slurm": "cluster"}.get(kind)
    if attempt.gang_nodes:
        word = "nodes"
    return f"{word} {place}" if word else place


def attempt_json(a: AttemptRecord) -> dict[str, Any]:
    data = a.model_dump(mode="json")
    data["failure_kind"] = a.reason.kind.value if a.reason else None
    data["where"] = a.where
    return data


def provenance_line(provenance: dict[str, Any] | None, dirty: bool) -> str | None:
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
    return ("DIRTY: " if dirty else "") + ", ".join(parts)


def run_json(view: RunView) -> dict[str, Any]:
    """A run as JSON, with its bundle path, progress, provenance and the image each attempt
    ran in a container."""
    run = view.run
    attempts = [attempt_json(a) | {"image": view.images.get(a.id)} for a in run.attempts]
    return {
        "id": run.id,
        "state": run.state.value,
        "experiment": {"id": run.experiment_id, "name": run.experiment_name},
        "task_type": run.task_type,
        "template_id": run.template_id,
        "bundle": {"digest": run.bundle_digest, "path": view.bundle_path},
        "created_at": run.created_at.isoformat(),
        "created_by": run.created_by,
        "replay_of": run.replay_of,
        "group": run.group_id,
        "policy": run.policy.model_dump(mode="json") if run.policy else None,
        "request": run.request.model_dump(mode="json"),
        "submission": run.submission.model_dump(mode="json"),
        "attempts": attempts,
        "progress": view.progress.model_dump(mode="json") if view.progress else None,
        "provenance": view.provenance,
        "dirty": view.dirty,
        "wait": view.wait.model_dump(mode="json") if view.wait else None,
        "storage": view.storage.model_dump(mode="json") if view.storage else None,
    }


def table(*columns: str) -> Table:
    """An aligned table: no cell is ever cut or split (see orbit.cli.text)."""
    return Table(*columns)


def runs_table(views: tuple[RunView, ...], wide: bool = False) -> Table:
    """The runs listing; `wide` (-o wide) adds the bundle and the creation time in full."""
    more = ("BUNDLE", "CREATED AT") if wide else ()
    out = table(
        "RUN",
        "EXPERIMENT",
        "USER",
        "STATE",
        "TASK",
        "TEMPLATE",
        "WHERE",
        "TRY",
        "CREATED",
        "OUTCOME",
        *more,
    )
    for view in views:
        run = view.run
        extra = (run.bundle_digest[:12], when(run.created_at)) if wide else ()
        out.add_row(
            run.id,
            run.experiment_name,
            run.created_by,
            styled(run.state) + (" " + paint("dirty", "yellow") if view.dirty else ""),
            run.task_type,
            run.template_id,
            run.current.where or "-",
            str(run.current.number),
            ago(run.created_at),
            outcome(run.current, view.wait),
            *extra,
        )
    return out


def show_run(console: Printer, view: RunView) -> None:
    run, progress = view.run, view.progress
    a = run.current
    console.print(f"{paint(run.id, 'bold')}  {styled(run.state)}  {outcome(a, view.wait)}".rstrip())
    rows = [
        ("experiment", f"{run.experiment_name} ({run.experiment_id})"),
        ("task", run.task_type),
        ("template", run.template_id),
        ("bundle", run.bundle_digest),
        ("cached at", view.bundle_path),
        ("created", f"{when(run.created_at)} by {run.created_by}"),
        ("where", where(a)),
        ("target", a.target or "-"),
    ]
    code = provenance_line(view.provenance, view.dirty)
    if code:
        rows.append(("code", code))
    from orbit.forensics.diagnose import image_line

    image = image_line(view.images.get(a.id))
    if image:
        rows.append(("image", image))
    if run.replay_of:
        rows.append(("replays", run.replay_of))
    if run.group_id:
        point = " ".join(f"{k}={v}" for k, v in run.submission.point.items())
        rows.append(("group", f"{run.group_id} ({point})"))
    rows += policy_rows(run.policy)
    after = run.submission.after
    for kind, runs in (("ok", after.ok), ("any", after.any)) if after else ():
        if runs:
            rows.append((f"after.{kind}", ", ".join(runs)))
    rows += storage_rows(view)
    if a.message and view.wait is None:  # a wait says what it waits for as of now
        rows.append(("message", a.message))
    if progress is not None:
        rows.append(("progress", f"{progress.describe()}  ({progress.file})"))
    if a.handle is not None:
        rows.append(("location", f"{a.handle.target}:{a.handle.location}"))
    for key, value in rows:
        console.print(f"  {key:<10} {value}")
    attempts = Table("#", "STATE", "TRIGGER", "WHERE", "STARTED", "FINISHED", "OUTCOME")
    attempts.title = "attempts"
    for attempt in run.attempts:
        attempts.add_row(
            str(attempt.number),
            styled(attempt.state),
            attempt.trigger,
            attempt.where or "-",
            when(attempt.started_at),
            when(attempt.finished_at),
            outcome(attempt, view.wait if attempt is a else None),
        )
    console.print(attempts)


def storage_rows(view: RunView) -> list[tuple[str, str]]:
    """Pinned, deleted, its artifacts expired: what `runs show` says of a run's storage."""
    marks, rows = view.storage, []
    if marks is not None and marks.pinned:
        rows.append(
            ("pinned", f"{when(marks.pinned_at)} by {marks.pinned_by} (retention skips it)")
        )
    if marks is not None and marks.deleted_at is not None:
        rows.append(("deleted", f"{when(marks.deleted_at)} by {marks.deleted_by} (artifacts gone)"))
    elif marks is not None and marks.expired_at is not None:
        rows.append(("expired", f"{when(marks.expired_at)}: artifacts removed by retention"))
    return rows


def placement_name(view: TemplateView) -> str:
    kind = view.template.placement.kind
    return kind if kind == view.canonical_placement else f"{kind} (= {view.canonical_placement})"


def templates_table(views: list[TemplateView]) -> Table:
    out = table("ID", "PLACEMENT", "LAUNCH", "DESCRIPTION")
    for view in views:
        t = view.template
        out.add_row(t.id, placement_name(view), t.launch_mode.kind, t.description)
    return out


def experiments_table(experiments: list[ExperimentRecord]) -> Table:
    out = table("ID", "NAME", "RUNS", "CREATED")
    for e in experiments:
        out.add_row(e.id, e.name, str(e.run_count), when(e.created_at))
    return out


def audit_table(events: list[AuditEvent]) -> Table:
    out = table("#", "AT", "ACTOR", "ACTION", "RUN", "DETAIL")
    for e in events:
        detail = " ".join(f"{k}={v}" for k, v in e.data.items())
        out.add_row(
            str(e.id), when(e.at), e.actor, e.action, e.attempt_id or e.run_id or "-", detail
        )
    return out


def describe_facts(facts: HostFacts) -> list[tuple[str, str]]:
    """The facts as label/value rows for people."""
    gpus = ", ".join(f"{g.index}: {g.name} ({g.memory_mib} MiB)" for g in facts.gpus) or (
        "none (nvidia-smi found no GPU)" if facts.nvidia_smi else "none (no nvidia-smi)"
    )
    free = facts.disk_free_bytes
    return [
        ("checked", f"{facts.checked_at:%Y-%m-%d %H:%M:%S} UTC"),
        ("os", facts.os or "?"),
        ("kernel", facts.kernel or "?"),
        (
            "python3",
            f"{facts.python_version} at {facts.python_path}" if facts.python_path else "MISSING",
        ),
        ("gpus", gpus),
        ("work dir", facts.work_dir or "?"),
        ("disk free", "?" if free is None else f"{free / 2**30:.1f} GiB"),
        ("docker", (facts.docker or "none") + (" (nvidia runtime)" if facts.docker_nvidia else "")),
        ("rsync", "yes" if facts.rsync else "MISSING"),
    ]


def policy_rows(stamp: PolicyStamp | None) -> list[tuple[str, str]]:
    """The policy a run was admitted under, and what it said of it."""
    if stamp is None or stamp.version is None:
        return []
    rows = [("policy", f"version {stamp.version}")]
    rows += [("warning", w) for w in stamp.warnings]
    rows += [("default", f"{k}={v} (set by the policy)") for k, v in stamp.defaults.items()]
    rows += [("rule error", e) for e in stamp.errors]
    return rows


def policy_warnings(stamp: PolicyStamp | None) -> None:
    """What a submit's policy said beyond yes, on stderr: its warnings and defaults."""
    for key, value in policy_rows(stamp)[1:]:
        print(f"policy {key}: {value}", file=sys.stderr)


def _secret_use(use: SecretUse) -> str:
    """`HF_TOKEN <- hf_token (yours: alice)`: never a value."""
    whose = {"user": f"yours: {use.owner}", "experiment": f"experiment {use.owner}"}
    return f"{use.env} <- {use.name} ({whose.get(use.scope.value, 'global')})"


def show_plan(console: Printer, plan: SubmitPlan) -> None:
    """What `submit --dry-run` found: what would run, where, from which bundle."""
    job = plan.job
    env = sorted(job.get("env", {}))
    resources = ", ".join(f"{k}={v}" for k, v in job.get("resources", {}).items())
    rows = [
        ("experiment", plan.experiment),
        ("task", plan.task_type),
        ("entrypoint", " ".join(job.get("entrypoint", []))),
        ("env", ", ".join(env) if env else "-"),
        ("secrets", ", ".join(_secret_use(u) for u in plan.secrets) or "-"),
        *policy_rows(plan.policy),
        ("resources", resources),
        ("template", plan.template_id),
        ("backend", plan.backend_key),
        ("target", plan.target or "-"),
        ("bundle", f"{plan.bundle_digest} ({plan.bundle_files} files, {plan.bundle_bytes} bytes)"),
    ]
    console.print(f"{paint('dry run', 'bold')}: nothing was submitted or written")
    for key, value in rows:
        console.print(f"  {key:<10} {value}")
