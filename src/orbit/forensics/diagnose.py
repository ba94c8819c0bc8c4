"""`orbit inspect`: walk the layered logs in the order one reads them after a failure
(runtime -> precheck -> training -> progress -> nvml) and say where the run first went wrong.
Pure: it reads an Evidence and returns data; the CLI renders it."""

from __future__ import annotations

import json
import math
from enum import StrEnum
from functools import partial
from typing import Any

from orbit.forensics.evidence import IMAGE_FILE, Evidence
from orbit.forensics.progress import _step as step_of
from orbit.model.models import FailureKind, FailureReason, Record, RunState


class Verdict(StrEnum):
    OK = "ok"
    FAILED = "failed"  # this layer is where it went wrong
    WARNING = "warning"  # worth a look, did not stop the run
    PENDING = "pending"  # not there yet: the run is still going
    ABSENT = "absent"  # nothing was recorded for this layer


class LayerReport(Record):
    layer: str
    question: str
    verdict: Verdict
    summary: str
    details: tuple[str, ...] = ()


class Inspection(Record):
    run_id: str
    attempt: int
    state: RunState
    layers: tuple[LayerReport, ...]

    @property
    def first_wrong(self) -> LayerReport | None:
        return next((r for r in self.layers if r.verdict is Verdict.FAILED), None)


def _lines(text: str, n: int) -> tuple[str, ...]:
    return tuple(line for line in text.splitlines()[-n:])


def image_line(image: dict[str, Any] | None) -> str | None:
    """`ref @ sha256:0123456789ab` (with the registry digest when the image has one)."""
    if not image:
        return None
    line = f"{image.get('ref')} @ {str(image.get('id'))[:19]}"
    digests = image.get("repo_digests") or []
    if digests:
        line += f" ({digests[0]})"
    return line


def runtime_layer(ev: Evidence) -> LayerReport:
    q = "did the wrapper stage and start?"
    report = partial(LayerReport, layer="runtime", question=q)
    log = ev.text("runtime/runtime.log")
    reason = ev.attempt.reason
    if ev.attempt.handle is None:
        verdict = Verdict.FAILED if ev.attempt.state.terminal else Verdict.PENDING
        return report(
            verdict=verdict,
            summary=ev.attempt.message or "the attempt was never launched",
        )
    # the image is part of staging: without it the wrapper could not start the task
    if reason is not None and (
        reason.kind is FailureKind.INFRASTRUCTURE or reason is FailureReason.IMAGE_NOT_FOUND
    ):
        return report(
            verdict=Verdict.FAILED,
            summary=f"{reason}: {ev.attempt.message or 'see runtime.log'}",
            details=_lines(log, 8),
        )
    if "wrapper started" not in log:
        verdict = Verdict.PENDING if not ev.attempt.state.terminal else Verdict.FAILED
        return report(
            verdict=verdict,
            summary="runtime.log has no start of the wrapper",
        )
    host = (ev.json("runtime/status.json") or {}).get("host", "?")
    image = image_line(ev.json(IMAGE_FILE))  # a docker run: the image that ran
    return report(
        verdict=Verdict.OK,
        summary=f"wrapper started on {host}" + (f", image {image}" if image else ""),
        details=_lines(log, 4),
    )


def _fork_problem(fork: dict[str, Any]) -> str:
    """Newer prechecks name the manifest in the error itself; older ones did not."""
    manifest, error = str(fork.get("manifest")), str(fork.get("error"))
    return f"fork {error}" if error.startswith(manifest) else f"fork {manifest}: {error}"


def precheck_layer(ev: Evidence) -> LayerReport:
    q = "are the declared dependencies the ones loaded?"
    report = partial(LayerReport, layer="precheck", question=q)
    found = ev.json("runtime/precheck.json")
    if found is None:
        verdict = Verdict.PENDING if not ev.attempt.state.terminal else Verdict.ABSENT
        return report(verdict=verdict, summary="no runtime/precheck.json")
    imports = found.get("critical_imports", [])
    forks = found.get("forks", [])
    bad = [f"missing {i['name']}: {i.get('error')}" for i in imports if not i.get("ok")]
    bad += [_fork_problem(f) for f in forks if not f.get("ok")]
    if bad:
        return report(verdict=Verdict.FAILED, summary=bad[0], details=tuple(bad))
    good = [f"{i['name']} {i.get('version') or '?'} from {i.get('path')}" for i in imports]
    python = found.get("python", {})
    summary = (
        f"python {python.get('version')}; {len(imports)} critical imports, {len(forks)} forks ok"
    )
    return report(verdict=Verdict.OK, summary=summary, details=tuple(good))


def training_layer(ev: Evidence) -> LayerReport:
    q = "what did the task itself do?"
    report = partial(LayerReport, layer="training", question=q)
    a = ev.attempt
    tail = _lines(ev.text("artifacts/training.log"), 10)
    if not a.state.terminal:
        return report(
            verdict=Verdict.PENDING,
            summary=f"the task is {a.state}",
            details=tail,
        )
    if a.state is RunState.SUCCEEDED:
        return report(
            verdict=Verdict.OK,
            summary="the task exited 0",
            details=tail,
        )
    if a.reason is not None and a.reason.kind is FailureKind.TASK:
        code = f"exit {a.exit_code}" if a.exit_code is not None else str(a.reason)
        return report(
            verdict=Verdict.FAILED,
            summary=f"the task failed ({code})",
            details=tail,
        )
    return report(
        verdict=Verdict.ABSENT,
        summary=f"the task did not finish on its own ({a.reason})",
        details=tail,
    )


def _losses(tails: dict[str, bytes]) -> list[tuple[int | None, float]]:
    out: list[tuple[int | None, float]] = []
    for _, tail in sorted(tails.items()):
        for line in tail.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            loss = record.get("loss") if isinstance(record, dict) else None
            if isinstance(loss, int | float) and not isinstance(loss, bool):
                out.append((step_of(record)[0], float(loss)))  # ms-swift's "10/100" too
    return out


def progress_layer(ev: Evidence) -> LayerReport:
    q = "did the optimizer make progress?"
    report = partial(LayerReport, layer="progress", question=q)
    tails = ev.matching("logging.jsonl")
    if not tails:
        return report(
            verdict=Verdict.ABSENT,
            summary="no artifacts/**/logging.jsonl",
        )
    losses = _losses(tails)
    if not losses:
        return report(
            verdict=Verdict.ABSENT,
            summary="logging.jsonl has no loss values",
        )
    if any(math.isnan(v) or math.isinf(v) for _, v in losses):
        step = next(s for s, v in losses if math.isnan(v) or math.isinf(v))
        return report(
            verdict=Verdict.FAILED,
            summary=f"loss became NaN/inf (first at step {step})",
        )
    window = max(1, len(losses) // 10)
    first = sum(v for _, v in losses[:window]) / window
    last = sum(v for _, v in losses[-window:]) / window
    summary = f"{len(losses)} logged steps, loss {first:.4g} -> {last:.4g}"
    verdict = Verdict.OK if last < first or len(losses) < 3 else Verdict.WARNING
    if verdict is Verdict.WARNING:
        summary += " (not decreasing)"
    return report(verdict=verdict, summary=summary)


def _numbers(samples: list[dict[str, Any]], key: str) -> list[float]:
    return [s[key] for s in samples if isinstance(s.get(key), int | float)]


def nvml_layer(ev: Evidence) -> LayerReport:
    q = "what were the GPUs doing?"
    report = partial(LayerReport, layer="nvml", question=q)
    raw = ev.tails.get("artifacts/nvml-audit.jsonl")
    if raw is None:
        return report(
            verdict=Verdict.ABSENT,
            summary="no artifacts/nvml-audit.jsonl",
        )
    per_gpu: dict[Any, list[dict[str, Any]]] = {}
    for line in raw.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("nvml") == "unavailable":
            return report(
                verdict=Verdict.ABSENT,
                summary=f"no GPU audit: {record.get('reason', 'NVML unavailable')}",
            )
        if isinstance(record, dict) and "index" in record:
            per_gpu.setdefault(record["index"], []).append(record)
    if not per_gpu:
        return report(
            verdict=Verdict.ABSENT,
            summary="nvml-audit.jsonl holds no samples",
        )
    details = []
    idle = []
    for index, samples in sorted(per_gpu.items(), key=lambda kv: str(kv[0])):
        utils = [s["util_gpu"] for s in samples if isinstance(s.get("util_gpu"), int | float)]
        mems = [
            s["mem_used_mib"] for s in samples if isinstance(s.get("mem_used_mib"), int | float)
        ]
        mean = sum(utils) / len(utils) if utils else 0.0
        if utils and max(utils) == 0:
            idle.append(str(index))
        details.append(
            f"gpu {index}: {len(samples)} samples, mean util {mean:.0f}%, "
            f"peak memory {max(mems) if mems else '?'} MiB"
        )
    if idle:
        return report(
            verdict=Verdict.WARNING,
            summary=f"GPU {', '.join(idle)} stayed at 0% utilization",
            details=tuple(details),
        )
    return report(
        verdict=Verdict.OK,
        summary=f"{len(per_gpu)} GPU(s) sampled",
        details=tuple(details),
    )


LAYERS = (runtime_layer, precheck_layer, training_layer, progress_layer, nvml_layer)


def inspect_run(ev: Evidence) -> Inspection:
    return Inspection(
        run_id=ev.run.id,
        attempt=ev.attempt.number,
        state=ev.attempt.state,
        layers=tuple(layer(ev) for layer in LAYERS),
    )
