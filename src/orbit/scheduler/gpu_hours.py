"""GPU-hours: how many each user and experiment held over a period, and per equal step of it
(a chart's bars), from the attempts that ran then; what a governance team checks fair share
against. Pure: the rows come from the store (store.runs.gpu_time)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orbit.model.errors import InvalidInput
from orbit.scheduler.resources import parse_gpu


@dataclass
class GpuHours:
    since: datetime
    until: datetime
    steps: list[float]  # each step's start (epoch s)
    users: dict[str, float] = field(default_factory=dict)  # user -> GPU-hours
    experiments: dict[str, float] = field(default_factory=dict)
    per_step: dict[str, list[float]] = field(default_factory=dict)  # user -> each step's


def gpus_of(request: dict[str, Any]) -> int:
    """The GPUs a stored request holds: per node (gpu, or gpu_count) times its nodes."""
    resources = request.get("resources") or {}
    try:
        each = (
            parse_gpu(resources["gpu"]).count
            if resources.get("gpu") is not None
            else int(resources.get("gpu_count") or 0)
        )
    except (InvalidInput, TypeError, ValueError):
        each = 0
    return each * max(1, int(request.get("num_nodes") or 1))


def gpu_hours(
    rows: Iterable[tuple[str, str, Any, datetime | None, datetime | None]],
    since: datetime,
    until: datetime,
    steps: int,
) -> GpuHours:
    """Sum each attempt's GPUs times the hours it ran within [since, until) (one still running
    counts up to `until`), per user, per experiment and per user in each of `steps` steps."""
    span = (until - since).total_seconds() / steps
    start = since.timestamp()
    found = GpuHours(since, until, [start + i * span for i in range(steps)])
    for user, experiment, request, began, ended in rows:
        gpus = gpus_of(request if isinstance(request, dict) else {})
        if gpus == 0 or began is None:
            continue
        a = max(began, since).timestamp()
        b = min(ended or until, until).timestamp()
        if b <= a:
            continue
        hours = gpus * (b - a) / 3600
        found.users[user] = found.users.get(user, 0.0) + hours
        found.experiments[experiment] = found.experiments.get(experiment, 0.0) + hours
        bars = found.per_step.setdefault(user, [0.0] * steps)
        for i in range(int((a - start) // span), min(steps, int((b - start) // span) + 1)):
            lo, hi = start + i * span, start + (i + 1) * span
            overlap = min(b, hi) - max(a, lo)
            if overlap > 0:
                bars[i] += gpus * overlap / 3600
    return found
