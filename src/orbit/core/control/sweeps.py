"""Sweeps: one submission made into a group of runs, one per point (orbit.model.sweeps), each a
normal run with its own bundle, identity and retries. Every point is validated, shaped, admitted
and frozen before the store is written; then the group and all its runs are written in one
transaction (orbit.store.groups), so a sweep is refused or accepted whole. The inputs are
gathered, sent and stored once: each point's bundle links the first one's files.

Groups are read with their runs' counts by state, and their best and worst runs by a metric
their tasks log to artifacts/**/logging.jsonl."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from orbit.core.control.idempotency import Idempotency, made_by, made_meanwhile
from orbit.core.control.submit import ShapedWire, Submitting, _Shaped, gather_inputs
from orbit.model.errors import InvalidInput, OrbitError
from orbit.model.groups import Goal, GroupView, RunGroup, Scored
from orbit.model.models import TaskSubmission
from orbit.model.states import RunState
from orbit.model.sweeps import Sweep, sweep_points
from orbit.store.runs import NewRun
from orbit.store.submit_keys import KeyTaken

if TYPE_CHECKING:
    from orbit.core.execution.bundle import FrozenBundle, Memo
    from orbit.model.records import RunRecord

SHOWN = 3  # runs a group's view names best and worst
MAX_LINKED = 2_000_000  # points x staged files: each point's bundle links every file


class Sweeping(Submitting):
    def submit_sweep(
        self,
        submission: TaskSubmission,
        sweep: Sweep,
        *,
        base_dir: Path,
        source: str = "submission",
    ) -> RunGroup:
        """Make the group of runs `sweep` gives of `submission` (its task's `{key}`
        placeholders filled by each point): gathered once here, then as a server does."""
        points = sweep_points(submission, sweep, source, self.config.max_sweep_points)
        with tempfile.TemporaryDirectory(prefix="orbit-sweep-") as tmp:
            inputs = Path(tmp) / "inputs"
            wire = gather_inputs(self.tasks, points[0], base_dir, source, inputs)
            return self.submit_sweep_staged(submission, sweep, wire, inputs, source)

    def submit_sweep_staged(
        self,
        submission: TaskSubmission,
        sweep: Sweep,
        shaped: ShapedWire,
        inputs: Path,
        source: str,
        idempotency: Idempotency | None = None,
        memo: Memo | None = None,
    ) -> RunGroup:
        """submit_sweep for a client of `orbit server`: it gathered the inputs once, shaping
        the sweep's first point (`shaped`); the server shapes every point itself over them.
        `memo`: the hashes of the inputs' files, where the caller knows them already."""
        from orbit.core.control.reshape import shape_points

        key = idempotency.of(self.actor) if idempotency else None
        earlier = made_by(self.store, key)
        if earlier is not None and earlier.group_id is not None:
            return self.store.groups.get_group(earlier.group_id)
        points = sweep_points(submission, sweep, source, self.config.max_sweep_points)
        files = sum(len(names) for _, _, names in os.walk(inputs))
        if files * len(points) > MAX_LINKED:
            raise InvalidInput(
                f"{source}: sweep: {len(points):,} points x {files:,} staged files is over "
                f"{MAX_LINKED:,} (each point's bundle holds every file): stage less (data "
                "belongs where the task reads it) or sweep fewer points"
            )
        each = shape_points(self.tasks, points, shaped, inputs, source, memo)
        prepared = [
            self._prepare(point, inputs, source, mine)
            for point, mine in zip(points, each, strict=True)
        ]
        bundles = self._freeze_points(prepared, inputs, memo)
        experiment = self._experiment(submission.experiment_id)
        runs = [
            NewRun(
                experiment.id,
                point.task_type,
                ready.template.id,
                bundle.digest,
                point.model_copy(update={"experiment_id": experiment.id, "after": ready.after}),
                ready.request,
                ready.policy,
            )
            for point, ready, bundle in zip(points, prepared, bundles, strict=True)
        ]
        try:
            group_id, _ = self.store.groups.create_group(
                experiment_id=experiment.id,
                sweep=sweep,
                runs=runs,
                actor=self.actor,
                launcher=self.parts.lifecycle.claim(),
                key=key,
            )
        except KeyTaken:  # the same request, sent again while this one was at work
            assert key is not None
            again = made_meanwhile(self.store, key)
            assert again.group_id is not None  # its fingerprint is a sweep's
            return self.store.groups.get_group(again.group_id)
        made = self.store.runs.list_runs(group_id=group_id)
        with self.parts.scheduling.one_pass_after():  # a pool's runs: queued, then placed
            for run in reversed(made):  # in the sweep's order
                self.parts.launching.launch(run, run.current, run.request, actor=self.actor)
        return self.store.groups.get_group(group_id)

    def _freeze_points(
        self, prepared: list[_Shaped], inputs: Path, known: Memo | None
    ) -> list[FrozenBundle]:
        """Each point's bundle, linking the same files (the same bytes, stored once; every
        attempt runs on its own copy), which are read and hashed once, not once a point."""
        from orbit.core.execution.bundle_link import freeze_linked

        memo = dict(known or {})
        return [freeze_linked(p.job, inputs, self.bundles_dir, memo) for p in prepared]

    # -- reading -----------------------------------------------------------------------------
    def list_groups(
        self,
        *,
        experiment: str | None = None,
        user: str | None = None,
        limit: int = 50,
        viewer: str | None = None,
    ) -> list[RunGroup]:
        """Newest first, each with its runs' counts by state."""
        experiment_id = self.store.experiments.get_experiment(experiment).id if experiment else None
        return self.store.groups.list_groups(
            experiment_id=experiment_id, user=user, viewer=viewer, limit=limit
        )

    def get_group(self, ref: str) -> RunGroup:
        """The group with its runs counted by state (embedded: its active runs looked at
        where they run first, as a listing of runs does)."""
        group_id = self.store.groups.resolve_group_id(ref)
        if self.config.looks_on_read:
            active = {s for s in RunState if not s.terminal}
            self.parts.lifecycle.refresh_active(
                self.store.runs.list_runs(group_id=group_id, states=active)
            )
        return self.store.groups.get_group(group_id)

    def group_view(self, ref: str, *, metric: str | None = None, goal: Goal = "min") -> GroupView:
        """The group, its runs in the sweep's order, and by `metric` (the newest value each
        run's logging.jsonl holds) its best and worst runs."""
        group = self.get_group(ref)
        runs = list(reversed(self.store.runs.list_runs(group_id=group.id)))
        view = GroupView(group=group, runs=tuple(r.id for r in runs), metric=metric, goal=goal)
        if metric is None:
            return view
        scored = [s for run in runs if (s := self._score(run, metric)) is not None]
        scored.sort(key=lambda s: s.value, reverse=goal == "max")
        return view.model_copy(
            update={
                "best": tuple(scored[:SHOWN]),
                "worst": tuple(reversed(scored[-SHOWN:])) if scored else (),
                "unscored": len(runs) - len(scored),
            }
        )

    def _score(self, run: RunRecord, metric: str) -> Scored | None:
        from orbit.forensics.progress import PROGRESS_GLOB, TAIL_BYTES, latest_value

        attempt = run.current
        if attempt.handle is None:
            return None
        try:
            backend = self.execution.backend(attempt.backend_key)
            tails = backend.tail_files(attempt.handle, PROGRESS_GLOB, TAIL_BYTES)
        except OrbitError:  # its host is away, say: it is left unscored
            return None
        found = latest_value(tails, metric)
        if found is None:
            return None
        return Scored(
            run=run.id, state=run.state, point=run.submission.point, value=found[0], step=found[1]
        )
