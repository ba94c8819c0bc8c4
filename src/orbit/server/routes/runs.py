"""/api/v1/runs: submitting (and its dry run), listing and showing runs, and controlling them
(cancel, retry, replay, one or many), with inspect and diff. A route that may block for
long (on a host, a node, a big upload) runs on the slow requests' threads (waiting.py)."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, File, Form, Header, Query, UploadFile
from pydantic import BaseModel, Field, ValidationError

from orbit.core.control.idempotency import HEADER, KEY_PATTERN, for_replay, for_submit
from orbit.core.control.service import CoreControlService
from orbit.core.control.submit import ShapedWire
from orbit.core.control.views import RunDiff, RunPage, RunView, SubmitPlan
from orbit.forensics.diagnose import Inspection
from orbit.model.bulk import MAX_RUNS, BulkResult, RunSelection
from orbit.model.errors import (
    Forbidden,
    InvalidInput,
    NotFound,
    OrbitError,
    describe_validation_error,
    pydantic_location,
)
from orbit.model.models import ExecutionOverrides, RunState, TaskSubmission
from orbit.model.records import RunRecord
from orbit.server import waiting
from orbit.server.auth import Caller
from orbit.server.config import ServerConfig
from orbit.server.input_sets import InputSets
from orbit.server.metrics import Metrics
from orbit.server.routes.common import NUL, RUN_REF, Body, api_router, me, unstorable
from orbit.server.waiting import on_slow_threads

MAX_FIELD = 1024 * 1024  # a submission's JSON fields; the whole request: limits.upload_bytes


class CancelBody(Body):
    wait_s: float | None = Field(default=None, ge=0, le=3600)


class BulkBody(Body):
    """Runs to act on: `ids`, or a filter (`experiment`, `group`, `states`, `user`); never
    both."""

    ids: list[RUN_REF] = Field(default=[], max_length=MAX_RUNS)
    experiment: str | None = Field(default=None, min_length=1, max_length=128)
    group: str | None = Field(default=None, min_length=1, max_length=40)
    states: list[RunState] = Field(default=[], max_length=len(RunState))
    user: str | None = Field(default=None, min_length=1, max_length=64)
    dry_run: bool = Field(default=False, description="only say what would be done")

    def selection(self, who: Caller) -> RunSelection:
        """For the caller: ids they may not see are not there (404); a filter leaves out the
        runs of restricted experiments they are not a member of."""
        for ref in self.ids:
            who.see_run(ref)
        return RunSelection(
            ids=tuple(self.ids),
            experiment=self.experiment,
            group=self.group,
            states=tuple(self.states),
            user=self.user,
            viewer=who.viewer,
        )


class OverridesBody(Body):
    overrides: ExecutionOverrides | None = None


class Stopped(BaseModel):
    stopped: int


SubmitForm = Annotated[str, Form(min_length=2, max_length=MAX_FIELD)]
Source = Annotated[str, Form(min_length=1, max_length=4096)]
Inputs = Annotated[
    UploadFile | None,
    File(
        description="the gathered inputs, as tar.gz; none where `inputs_digest` names inputs "
        "this user sent before (409 InputsWanted where the server does not hold them)"
    ),
]
InputsDigest = Annotated[
    str | None,
    Form(
        pattern=r"^[0-9a-f]{64}$",
        description="the digest of the gathered inputs (sha256, as a bundle's digest counts "
        "inputs/): with the archive, what it must give; alone, inputs sent before",
    ),
]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias=HEADER,
        pattern=KEY_PATTERN,
        description="a fresh one per submission (a uuid); sent again with the same request "
        "after a lost answer, it is answered with the run the first one made (kept a day)",
    ),
]


def may_run(service: CoreControlService, who: Caller, task: TaskSubmission) -> None:
    """The experiment is one the caller sees, and the template's placement is theirs to
    use (an unknown template is left for the submit itself to name)."""
    found = service.store.experiments.find_experiment(task.experiment_id)
    if found is not None and found.id in who.hidden:
        raise Forbidden(
            f"experiment: '{found.name}' is restricted to its members, and "
            f"{who.user.name} is not one (orbit experiments members {found.name})"
        )
    template_id = task.template_id
    try:
        template = service.templates.get(template_id)
    except OrbitError:
        return
    who.require_placement(template.id, template.placement.kind)


def parse_submission(
    submission: str, shaped: str, source: str
) -> tuple[TaskSubmission, ShapedWire]:
    """A submit's form fields as records; refused naming the field."""
    if "\x00" in source:
        raise InvalidInput(f"source: {NUL}")
    try:
        parsed = (
            TaskSubmission.model_validate_json(submission),
            ShapedWire.model_validate_json(shaped),
        )
    except ValidationError as exc:
        raise InvalidInput(describe_validation_error(source, exc)) from None
    if parsed[0].point:
        raise InvalidInput(
            f"{source}: submission.point: made by a sweep (POST /groups), never sent"
        )
    for name, text in (("submission", submission), ("shaped", shaped)):
        found = unstorable(json.loads(text))
        if found is not None:
            where, why = found
            raise InvalidInput(f"{source}: {name}.{pydantic_location(where)}: {why}")
    return parsed


def make_runs_router(
    service: CoreControlService, config: ServerConfig, metrics: Metrics
) -> APIRouter:
    router = api_router()

    held = InputSets(service.bundles_dir, config.limits)

    def may_push(who: Caller, run: RunRecord) -> None:
        """A new attempt or run of `run`'s bundle goes where its recorded request says."""
        who.require_placement(run.template_id, run.request.placement.kind)

    # -- submitting ----------------------------------------------------------------------
    @router.post("/runs", response_model=RunRecord, status_code=201, tags=["runs"])
    @on_slow_threads
    def submit(
        who: me,
        submission: SubmitForm,
        shaped: SubmitForm,
        source: Source,
        inputs: Inputs = None,
        inputs_digest: InputsDigest = None,
        key: IdempotencyKey = None,
    ) -> RunRecord:
        """Freeze and start a run from a submission and the inputs its client gathered (sent,
        or named by `inputs_digest` where this user sent them before). The server shapes the
        task_request again and refuses a `shaped` that differs."""
        task, wire = parse_submission(submission, shaped, source)
        may_run(service, who, task)
        upload = inputs.file if inputs is not None else None
        with held.receive(who.user.id, inputs_digest, upload) as got, who.acting() as svc:
            metrics.count_inputs(got)
            again = for_submit(key, submission, shaped, source, got.digest)
            try:
                run = svc.submit_staged(task, wire, got.folder, source, again, got.memo)
            except Exception:
                metrics.submissions.labels("refused").inc()
                raise
            held.remember(who.user.id, got, run.bundle_digest)
        metrics.submissions.labels("accepted").inc()
        return run

    @router.post("/runs/plan", response_model=SubmitPlan, tags=["runs"])
    @on_slow_threads
    def plan(
        who: me,
        submission: SubmitForm,
        shaped: SubmitForm,
        source: Source,
        inputs: Inputs = None,
        inputs_digest: InputsDigest = None,
    ) -> SubmitPlan:
        """What submitting would run and where (a dry run): nothing is written."""
        task, wire = parse_submission(submission, shaped, source)
        may_run(service, who, task)
        upload = inputs.file if inputs is not None else None
        with held.receive(who.user.id, inputs_digest, upload) as got:
            metrics.count_inputs(got)
            return service.plan_staged(task, wire, got.folder, source, got.memo)

    # -- runs ------------------------------------------------------------------------------
    @router.get("/runs", response_model=RunPage, tags=["runs"])
    def list_runs(
        who: me,
        experiment: Annotated[str | None, Query(max_length=128)] = None,
        state: Annotated[list[RunState] | None, Query()] = None,
        limit: Annotated[int | None, Query(ge=1, le=10_000)] = None,
        user: Annotated[str | None, Query(max_length=128, description="who submitted")] = None,
        node: Annotated[
            str | None, Query(max_length=256, description="where its attempt is: node, host")
        ] = None,
        mine: Annotated[bool, Query(description="the caller's own runs")] = False,
        group: Annotated[
            str | None, Query(max_length=40, description="the runs of one group (a sweep's)")
        ] = None,
    ) -> RunPage:
        """Runs, newest first, with how many match; filters: experiment, state (of the
        current attempt), user (who submitted; `mine`: the caller), node (where the current
        attempt is: an agent node, an SSH host or a Slurm cluster, by name), group (a sweep's
        runs, by id or prefix)."""
        if mine and user is None:
            user = who.user.name
        elif mine:
            raise InvalidInput("mine and user: give one of them")
        if group is not None and service.get_group(group).experiment_id in who.hidden:
            raise NotFound(f"unknown group '{group}' (see 'orbit groups list')")
        return service.run_page(
            experiment=experiment,
            states=set(state or ()),
            limit=limit,
            user=user,
            node=node,
            group=group,
            viewer=who.viewer,
        )

    @router.get("/runs/{ref}", response_model=RunRecord, tags=["runs"])
    def get_run(who: me, ref: RUN_REF) -> RunRecord:
        return service.get_run(ref)

    @router.get("/runs/{ref}/view", response_model=RunView, tags=["runs"])
    @on_slow_threads  # it asks where the run executes
    def run_view(who: me, ref: RUN_REF, refresh: bool = True, images: bool = False) -> RunView:
        return service.run_view(ref, refresh=refresh, images=images)

    @router.post("/runs/{ref}/refresh", response_model=RunRecord, tags=["runs"])
    @on_slow_threads
    def refresh(who: me, ref: RUN_REF) -> RunRecord:
        """Ask where the run executes how it stands now (the server's loops do this anyway)."""
        return service.refresh_run_status(ref)

    @router.post("/runs/cancel", response_model=BulkResult, tags=["runs"])
    @on_slow_threads
    def cancel_many(who: me, body: BulkBody) -> BulkResult:
        """Cancel many runs: these `ids`, or those a filter matches. A member's call acts on its
        own runs and reports the others refused; `dry_run` only says what would be done."""

        def may(run: RunRecord) -> str | None:
            return who.refusal(run, "runs.cancel")

        with who.acting() as svc:
            return svc.cancel_runs(body.selection(who), dry_run=body.dry_run, may=may)

    @router.post("/runs/retry", response_model=BulkResult, tags=["runs"])
    @on_slow_threads
    def retry_many(who: me, body: BulkBody) -> BulkResult:
        """Retry many ended runs (a new attempt each): these `ids`, or those a filter matches.
        A member's call acts on its own runs and reports the others refused, as it does runs
        whose template runs on the server's own host where its role may not (local_roles)."""

        def may(run: RunRecord) -> str | None:
            try:
                may_push(who, run)
            except Forbidden as exc:
                return who.refusal(run, "runs.retry") or str(exc)
            return who.refusal(run, "runs.retry")

        with who.acting() as svc:
            return svc.retry_runs(body.selection(who), dry_run=body.dry_run, may=may)

    @router.post("/runs/{ref}/cancel", response_model=RunRecord, tags=["runs"])
    async def cancel(who: me, ref: RUN_REF, body: CancelBody | None = None) -> RunRecord:
        """Ask for a graceful stop, and wait up to `wait_s` (default: the run's stop grace
        and 5 s) for the run to end; the answer is the run as it then stands."""

        def ask() -> tuple[RunRecord, float | None]:
            with who.acting() as svc:  # whose run it is: the gate's (runs.cancel.own)
                return svc.ask_to_cancel(ref, (body or CancelBody()).wait_s)

        run, wait = await waiting.slow(ask)  # a backend's cancel may contact its host
        return run if wait is None else await waiting.until_ended(service, run.id, wait)

    @router.post("/runs/{ref}/retry", response_model=RunRecord, tags=["runs"])
    @on_slow_threads
    def retry(who: me, ref: RUN_REF, body: OverridesBody | None = None) -> RunRecord:
        may_push(who, service.get_run(ref))  # whose run it is: the gate's (runs.retry.own)
        with who.acting() as svc:
            return svc.retry_run(ref, (body or OverridesBody()).overrides)

    @router.post("/runs/{ref}/replay", response_model=RunRecord, status_code=201, tags=["runs"])
    @on_slow_threads
    def replay(
        who: me, ref: RUN_REF, body: OverridesBody | None = None, key: IdempotencyKey = None
    ) -> RunRecord:
        """A new run of the same bundle: the caller's own, so any member may replay any run."""
        may_push(who, service.get_run(ref))
        overrides = (body or OverridesBody()).overrides
        again = for_replay(key, ref, overrides)
        with who.acting() as svc:
            return svc.replay_run(ref, overrides, again)

    @router.post("/runs/{ref}/leftovers/stop", response_model=Stopped, tags=["runs"])
    @on_slow_threads
    def stop_leftovers(who: me, ref: RUN_REF) -> Stopped:
        with who.acting() as svc:  # whose run it is: the gate's (runs.cancel.own)
            return Stopped(stopped=svc.stop_leftovers(ref))

    @router.get("/runs/{ref}/inspect", response_model=Inspection, tags=["forensics"])
    @on_slow_threads  # it reads the layered logs where the run executes
    def inspect(
        who: me, ref: RUN_REF, attempt: Annotated[int | None, Query(ge=1)] = None
    ) -> Inspection:
        return service.inspect_run(ref, attempt)

    @router.get("/diff", response_model=RunDiff, tags=["forensics"])
    def diff(who: me, a: RUN_REF, b: RUN_REF) -> RunDiff:
        who.see_run(a), who.see_run(b)
        return service.diff_runs(a, b)

    return router
