"""/api/v1/groups: a sweep submitted (one run per point, made as one group, or none of them),
and the groups read: listed with their runs' counts by state, one with its best and worst
runs by a metric. Restricted experiments' groups are not there for those who may not see them."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from fastapi import APIRouter, Form, Query
from pydantic import Field

from orbit.core.control.idempotency import for_sweep
from orbit.core.control.service import CoreControlService
from orbit.model.errors import InvalidInput, NotFound, StoreError, pydantic_location
from orbit.model.groups import GroupPage, GroupView, RunGroup
from orbit.model.sweeps import sweep_of
from orbit.server.auth import Caller
from orbit.server.config import ServerConfig
from orbit.server.input_sets import InputSets
from orbit.server.metrics import Metrics
from orbit.server.routes.common import api_router, me, unstorable
from orbit.server.routes.runs import (
    MAX_FIELD,
    IdempotencyKey,
    Inputs,
    InputsDigest,
    Source,
    SubmitForm,
    may_run,
    parse_submission,
)
from orbit.server.waiting import on_slow_threads

GROUP_REF = Annotated[str, Field(min_length=1, max_length=40, pattern=r"^[A-Za-z0-9_-]+$")]
SweepForm = Annotated[str, Form(min_length=2, max_length=MAX_FIELD)]
METRIC = r"^[A-Za-z0-9_./()-]{1,128}$"  # a logging.jsonl key: loss, eval/acc, memory(GiB)


def make_groups_router(
    service: CoreControlService, config: ServerConfig, metrics: Metrics
) -> APIRouter:
    router = api_router()
    held = InputSets(service.bundles_dir, config.limits)

    def seen(who: Caller, group: RunGroup, ref: str) -> RunGroup:
        if group.experiment_id in who.hidden:
            raise NotFound(f"unknown group '{ref}' (see 'orbit groups list')")
        return group

    @router.post("/groups", response_model=RunGroup, status_code=201, tags=["groups"])
    @on_slow_threads
    def submit_sweep(
        who: me,
        submission: SubmitForm,
        shaped: SubmitForm,
        sweep: SweepForm,
        source: Source,
        inputs: Inputs = None,
        inputs_digest: InputsDigest = None,
        key: IdempotencyKey = None,
    ) -> RunGroup:
        """One run per point of `sweep` (its values in the task's `{key}` placeholders), made
        as one group from the inputs its client gathered once (shaping the first point, as
        `shaped` says): every point is checked before any run is written, and then all of
        them are written together, or none."""
        task, wire = parse_submission(submission, shaped, source)
        points = sweep_of(sweep, source)
        found = unstorable(json.loads(sweep))
        if found is not None:
            raise InvalidInput(f"{source}: sweep.{pydantic_location(found[0])}: {found[1]}")
        may_run(service, who, task)
        upload = inputs.file if inputs is not None else None
        with held.receive(who.user.id, inputs_digest, upload) as got, who.acting() as svc:
            metrics.count_inputs(got)
            again = for_sweep(key, submission, shaped, sweep, source, got.digest)
            try:
                group = svc.submit_sweep_staged(
                    task, points, wire, got.folder, source, again, got.memo
                )
            except Exception:
                metrics.submissions.labels("refused").inc()
                raise
            try:  # every point's bundle holds the same inputs
                first = svc.store.runs.list_runs(group_id=group.id, limit=1)
            except StoreError:  # the group is made: its answer must not fail for this
                first = []
            if first:
                held.remember(who.user.id, got, first[0].bundle_digest)
        metrics.submissions.labels("accepted").inc(group.size)
        return group

    @router.get("/groups", response_model=GroupPage, tags=["groups"])
    def list_groups(
        who: me,
        experiment: Annotated[str | None, Query(max_length=128)] = None,
        user: Annotated[str | None, Query(max_length=128, description="who made it")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> GroupPage:
        """Groups, newest first, with their runs counted by state."""
        groups = service.list_groups(
            experiment=experiment, user=user, limit=limit, viewer=who.viewer
        )
        return GroupPage(groups=tuple(groups))

    @router.get("/groups/{ref}", response_model=RunGroup, tags=["groups"])
    def get_group(who: me, ref: GROUP_REF) -> RunGroup:
        return seen(who, service.get_group(ref), ref)

    @router.get("/groups/{ref}/view", response_model=GroupView, tags=["groups"])
    @on_slow_threads  # it reads each run's logging.jsonl where the run is
    def group_view(
        who: me,
        ref: GROUP_REF,
        metric: Annotated[str | None, Query(pattern=METRIC)] = None,
        goal: Literal["min", "max"] = "min",
    ) -> GroupView:
        """The group, its runs in the sweep's order and, by `metric`, its best and worst."""
        seen(who, service.get_group(ref), ref)
        return service.group_view(ref, metric=metric, goal=goal)

    return router
