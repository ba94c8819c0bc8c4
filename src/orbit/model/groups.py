"""Run groups: the runs one sweep made together (orbit.model.sweeps), each a normal run with its
own bundle, identity and retries, and how they stand: counts by state, and the best and worst
of them by a metric their tasks log."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from orbit.model.models import Record
from orbit.model.states import RunState
from orbit.model.sweeps import Sweep

Goal = Literal["min", "max"]


class RunGroup(Record):
    id: str
    experiment_id: str
    experiment_name: str
    created_at: datetime
    created_by: str
    size: int  # runs made
    sweep: Sweep  # as submitted
    counts: dict[str, int] = {}  # current state -> runs, in the order of RunState

    @property
    def ended(self) -> bool:
        return all(RunState(s).terminal for s in self.counts)


class GroupPage(Record):
    groups: tuple[RunGroup, ...]


class Scored(Record):
    """One run of a group, by the newest value of a metric its logging.jsonl holds."""

    run: str
    state: RunState
    point: dict[str, str]
    value: float
    step: int | None = None


class GroupView(Record):
    """A group with the runs it made (newest first is not their order: a sweep's own order),
    and, by `metric`, its best and worst runs (`goal`: lower or higher is better)."""

    group: RunGroup
    runs: tuple[str, ...] = ()  # in the sweep's order
    metric: str | None = None
    goal: Goal = "min"
    best: tuple[Scored, ...] = ()
    worst: tuple[Scored, ...] = ()
    unscored: int = 0  # runs whose logging.jsonl said nothing of the metric (yet)
