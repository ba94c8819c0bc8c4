"""Sweeps and the groups of runs they make, through `orbit server` (orbit.client.remote's
RemoteControl names these methods as its own)."""

from __future__ import annotations

from pathlib import Path

from orbit.client.meter import Meter
from orbit.client.session import Session, part
from orbit.client.uploads import upload
from orbit.model.groups import Goal, GroupPage, GroupView, RunGroup
from orbit.model.models import TaskSubmission
from orbit.model.sweeps import Sweep


class RemoteGroups:
    def __init__(self, session: Session, meter: Meter) -> None:
        self.session = session
        self.meter = meter

    def submit_sweep(
        self,
        submission: TaskSubmission,
        sweep: Sweep,
        *,
        base_dir: Path,
        source: str = "submission",
    ) -> RunGroup:
        """The inputs gathered once, shaping the sweep's first point; the server makes every
        point's run (and refuses the whole sweep, or makes all of it)."""
        from orbit.model.sweeps import sweep_points

        first = sweep_points(submission, sweep, source)[0]
        return upload(
            self.session,
            RunGroup,
            "/groups",
            submission,
            base_dir,
            source,
            makes_run=True,
            meter=self.meter,
            gather=first,
            fields={"sweep": sweep.model_dump_json(exclude_defaults=True)},
        )

    def list_groups(
        self, *, experiment: str | None = None, user: str | None = None, limit: int = 50
    ) -> list[RunGroup]:
        page = self.session.get(GroupPage, "/groups", experiment=experiment, user=user, limit=limit)
        return list(page.groups)

    def get_group(self, ref: str) -> RunGroup:
        return self.session.get(RunGroup, f"/groups/{part(ref)}")

    def group_view(self, ref: str, *, metric: str | None = None, goal: Goal = "min") -> GroupView:
        return self.session.get(GroupView, f"/groups/{part(ref)}/view", metric=metric, goal=goal)
