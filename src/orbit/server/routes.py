"""/api/v1: everything the CLI does, over HTTP. Each route checks what the caller's role allows
and calls the control service acting for the caller; nothing here decides anything else."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import math
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, File, Form, Header, Query, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.background import BackgroundTask

from orbit.agent.protocol import MAX_LABELS
from orbit.core.auth import NewToken, Role, TokenRecord, UserRecord
from orbit.core.clusters import ClusterCheck, ClusterRecord, ClusterSpec
from orbit.core.control.service import CoreControlService
from orbit.core.control.submit import ShapedWire
from orbit.core.control.views import (
    Explanation,
    HostCheck,
    QueueEntry,
    QuotaView,
    RunDiff,
    RunPage,
    RunView,
    Simulation,
    SubmitPlan,
    TemplateView,
)
from orbit.core.errors import (
    Forbidden,
    InvalidInput,
    OrbitError,
    describe_validation_error,
    pydantic_location,
)
from orbit.core.hosts import HostRecord, HostSpec
from orbit.core.layers import LogLayer
from orbit.core.models import ExecutionOverrides, RunState, TaskSubmission
from orbit.core.nodes import MAX_TRANSFER_BYTES, JoinTokenRecord, NewJoinToken, NodeRecord
from orbit.core.records import AttemptRecord, AuditEvent, ExperimentRecord, RunRecord
from orbit.forensics.diagnose import Inspection
from orbit.server.auth import Caller
from orbit.server.config import ServerConfig
from orbit.server.metrics import Metrics
from orbit.server.problems import PROBLEM, PROBLEM_SCHEMA
from orbit.server.uploads import unpack_inputs

FOLLOW_S = 30.0  # a followed log stream ends after this long without the attempt ending: the
# client asks again from where it got to (proxies drop streams that stay open for long)
EVENT_BYTES = 16 * 1024  # the most log bytes one event carries (a cut stream loses at most one)
MAX_OFFSET = 2**63 - 1  # the largest offset a file can be read from
MAX_FIELD = 1024 * 1024  # a submission's JSON fields; the whole request: limits.upload_bytes
# one event of a log stream (before OpenAPI 3.2, a stream's `schema` describes each event)
LOG_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"enum": ["log", "end"]},
        "id": {"type": "string", "description": "the log's byte offset after this event"},
        "data": {"type": "string", "description": "log: base64 bytes; end: a JSON object"},
    },
}
QUOTA_SCOPE = Annotated[str, Field(pattern="^(user|experiment)$")]
QUOTA_NAME = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^/\x00]+$")]
RUN_REF = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
# a node's name or id (names as orbit.agent.protocol.NODE_NAME allows them)
NODE_REF = Annotated[
    str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]
JOIN_ID = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
NODE_PATH = Annotated[str, Query(min_length=1, max_length=4096, description="under its work dir")]
OCTETS: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/octet-stream": {"schema": {"type": "string"}}}}
}


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NewExperiment(Body):
    name: str = Field(min_length=1, max_length=128)


class CancelBody(Body):
    wait_s: float | None = Field(default=None, ge=0, le=3600)


class OverridesBody(Body):
    overrides: ExecutionOverrides | None = None


class NewHost(Body):
    spec: HostSpec
    check: bool = True


class NewCluster(Body):
    spec: ClusterSpec
    check: bool = True


class CheckCluster(Body):
    sweep: bool = False  # cancel this control plane's ORBIT jobs that no live attempt owns


class NewUser(Body):
    name: str = Field(min_length=1, max_length=64)
    role: Role = Role.MEMBER


class NewTokenBody(Body):
    user: str | None = Field(default=None, min_length=1, max_length=64)
    name: str | None = Field(default=None, min_length=1, max_length=128)
    expires: str | None = Field(default=None, min_length=1, max_length=16, examples=["30d"])


class NewJoinTokenBody(Body):
    labels: dict[str, str] = Field(
        default={}, max_length=MAX_LABELS, description="given to every node that joins with it"
    )
    expires: str | None = Field(default=None, min_length=1, max_length=16, examples=["30d"])


class QuotaBody(Body):
    gpus: int = Field(ge=0, le=1_000_000, description="at most this many GPUs at once")
    weight: float = Field(default=1.0, gt=0, le=1000, description="fair-share weight")


class SimulateBody(Body):
    since_s: float = Field(gt=0, le=366 * 86400, description="replay the passes this far back")
    config: dict[str, Any] = Field(description="a scheduler config mapping to try")


class NodeSettings(Body):
    cordon: bool | None = Field(default=None, description="true: no new work; false: again")
    # 0 to 1024, checked by the service (its error names --max-tasks, as the CLI's does)
    max_tasks: int | None = Field(default=None, description="attempts at once, 0 to 1024; 0: drain")


class Pushed(BaseModel):
    node: str
    dest: str
    size: int
    result: dict[str, Any] = {}  # what the node's agent answered


class Stopped(BaseModel):
    stopped: int


class Removed(BaseModel):
    removed: str
    stopped_attempts: list[str] = []


class ChainReport(BaseModel):
    events: int
    head: str | None
    problems: list[str]
    intact: bool


def _problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    content = {PROBLEM: {"schema": PROBLEM_SCHEMA}}
    return {code: {"description": "a problem (RFC 9457)", "content": content} for code in codes}


def caller(request: Request) -> Caller:
    """The request's user (found by auth.RequireToken before the body was read), and the
    service that will act for them."""
    user: UserRecord = request.state.user
    return Caller(user, request.app.state.service)


me = Annotated[Caller, Depends(caller)]
NUL = "must not contain NUL (\\x00)"
NOT_FINITE = "must be a finite number"
Loc = tuple[str | int, ...]


def unstorable(value: Any) -> tuple[Loc, str] | None:
    """Where in a JSON value is something no store keeps as it was sent, and why: a NUL in a
    text or key (PostgreSQL refuses it, SQLite keeps it), or a number too large to be finite
    (1e400, or Python's Infinity and NaN: JSON has none, PostgreSQL refuses them)."""
    stack: list[tuple[Loc, Any]] = [((), value)]
    while stack:  # not recursive: a body may nest as deep as JSON parsers allow
        loc, item = stack.pop()
        if isinstance(item, str) and "\x00" in item:
            return loc, NUL
        if isinstance(item, float) and not math.isfinite(item):
            return loc, NOT_FINITE
        if isinstance(item, dict):
            for key, sub in item.items():
                if "\x00" in key:
                    return (*loc, _shown(key)), NUL
                stack.append(((*loc, key), sub))
        elif isinstance(item, list):
            stack.extend(((*loc, index), sub) for index, sub in enumerate(item))
    return None


def _shown(name: str) -> str:
    return name.replace("\x00", "\\x00")


async def storable(request: Request, who: me) -> None:
    """Refuse, naming the field, a path, query or JSON body that holds what no store keeps
    as sent (see `unstorable`): every store then answers alike, with a 422 rather than
    PostgreSQL's 503. After `who`: a caller without a token hears 401 first."""
    params = [("path", k, v) for k, v in request.path_params.items()]
    params += [("query", k, v) for k, v in request.query_params.multi_items()]
    found: tuple[Loc, str] | None = next(
        (((kind, _shown(k)), NUL) for kind, k, v in params if "\x00" in k + v), None
    )
    content_type = request.headers.get("content-type", "")
    if found is None and request.method != "GET" and "form" not in content_type:
        try:
            in_body = unstorable(json.loads(await request.body() or b"null"))
        except (ValueError, RecursionError):
            return  # not JSON: FastAPI says what is wrong with it
        found = None if in_body is None else (("body", *in_body[0]), in_body[1])
    if found is not None:
        raise RequestValidationError([{"type": "unstorable", "loc": found[0], "msg": found[1]}])


SubmitForm = Annotated[str, Form(min_length=2, max_length=MAX_FIELD)]
Source = Annotated[str, Form(min_length=1, max_length=4096)]
Inputs = Annotated[UploadFile, File(description="the gathered inputs, as tar.gz")]


def make_router(service: CoreControlService, config: ServerConfig, metrics: Metrics) -> APIRouter:
    router = APIRouter(
        prefix="/api/v1",
        responses=_problems(400, 401, 403, 404, 409, 422, 502),
        dependencies=[Depends(storable)],
    )

    def own_run(who: Caller, ref: str) -> RunRecord:
        run = service.get_run(ref)
        who.require_run(run)
        return run

    # -- who am I ------------------------------------------------------------------------
    @router.get("/whoami", response_model=UserRecord, tags=["users"])
    def whoami(who: me) -> UserRecord:
        return who.user

    # -- templates and experiments -----------------------------------------------------------
    @router.get("/templates", response_model=list[TemplateView], tags=["catalogue"])
    def list_templates(who: me) -> list[TemplateView]:
        return service.list_templates()

    @router.get("/templates/{template_id}", response_model=TemplateView, tags=["catalogue"])
    def get_template(who: me, template_id: str) -> TemplateView:
        return service.get_template(template_id)

    @router.get("/experiments", response_model=list[ExperimentRecord], tags=["catalogue"])
    def list_experiments(who: me) -> list[ExperimentRecord]:
        return service.list_experiments()

    @router.post(
        "/experiments", response_model=ExperimentRecord, status_code=201, tags=["catalogue"]
    )
    def create_experiment(who: me, body: NewExperiment) -> ExperimentRecord:
        who.require("submit")
        with who.acting() as svc:
            return svc.create_experiment(body.name)

    # -- submitting ----------------------------------------------------------------------
    def _submission(submission: str, shaped: str, source: str) -> tuple[TaskSubmission, ShapedWire]:
        if "\x00" in source:
            raise InvalidInput(f"source: {NUL}")
        try:
            parsed = (
                TaskSubmission.model_validate_json(submission),
                ShapedWire.model_validate_json(shaped),
            )
        except ValidationError as exc:
            raise InvalidInput(describe_validation_error(source, exc)) from None
        for name, text in (("submission", submission), ("shaped", shaped)):
            found = unstorable(json.loads(text))
            if found is not None:
                where, why = found
                raise InvalidInput(f"{source}: {name}.{pydantic_location(where)}: {why}")
        return parsed

    @router.post("/runs", response_model=RunRecord, status_code=201, tags=["runs"])
    def submit(
        who: me, submission: SubmitForm, shaped: SubmitForm, source: Source, inputs: Inputs
    ) -> RunRecord:
        """Freeze and start a run from a submission and the inputs its client gathered."""
        who.require("submit")
        task, wire = _submission(submission, shaped, source)
        with unpack_inputs(inputs.file, config.limits) as folder, who.acting() as svc:
            try:
                run = svc.submit_staged(task, wire, folder, source)
            except Exception:
                metrics.submissions.labels("refused").inc()
                raise
        metrics.submissions.labels("accepted").inc()
        return run

    @router.post("/runs/plan", response_model=SubmitPlan, tags=["runs"])
    def plan(
        who: me, submission: SubmitForm, shaped: SubmitForm, source: Source, inputs: Inputs
    ) -> SubmitPlan:
        """What submitting would run and where (a dry run): nothing is written."""
        who.require("submit")  # it unpacks and freezes what was sent: a reader has no need
        task, wire = _submission(submission, shaped, source)
        with unpack_inputs(inputs.file, config.limits) as folder:
            return service.plan_staged(task, wire, folder, source)

    # -- runs ------------------------------------------------------------------------------
    @router.get("/runs", response_model=RunPage, tags=["runs"])
    def list_runs(
        who: me,
        experiment: Annotated[str | None, Query(max_length=128)] = None,
        state: Annotated[list[RunState] | None, Query()] = None,
        limit: Annotated[int | None, Query(ge=1, le=10_000)] = None,
    ) -> RunPage:
        return service.run_page(experiment=experiment, states=set(state or ()), limit=limit)

    @router.get("/runs/{ref}", response_model=RunRecord, tags=["runs"])
    def get_run(who: me, ref: RUN_REF) -> RunRecord:
        return service.get_run(ref)

    @router.get("/runs/{ref}/view", response_model=RunView, tags=["runs"])
    def run_view(who: me, ref: RUN_REF, refresh: bool = True, images: bool = False) -> RunView:
        return service.run_view(ref, refresh=refresh, images=images)

    @router.post("/runs/{ref}/refresh", response_model=RunRecord, tags=["runs"])
    def refresh(who: me, ref: RUN_REF) -> RunRecord:
        """Ask where the run executes how it stands now (the server's loops do this anyway)."""
        return service.refresh_run_status(ref)

    @router.post("/runs/{ref}/cancel", response_model=RunRecord, tags=["runs"])
    def cancel(who: me, ref: RUN_REF, body: CancelBody | None = None) -> RunRecord:
        own_run(who, ref)
        with who.acting() as svc:
            return svc.cancel_run(ref, wait_s=(body or CancelBody()).wait_s)

    @router.post("/runs/{ref}/retry", response_model=RunRecord, tags=["runs"])
    def retry(who: me, ref: RUN_REF, body: OverridesBody | None = None) -> RunRecord:
        own_run(who, ref)
        with who.acting() as svc:
            return svc.retry_run(ref, (body or OverridesBody()).overrides)

    @router.post("/runs/{ref}/replay", response_model=RunRecord, status_code=201, tags=["runs"])
    def replay(who: me, ref: RUN_REF, body: OverridesBody | None = None) -> RunRecord:
        """A new run of the same bundle: the caller's own, so any member may replay any run."""
        who.require("submit")
        with who.acting() as svc:
            return svc.replay_run(ref, (body or OverridesBody()).overrides)

    @router.post("/runs/{ref}/leftovers/stop", response_model=Stopped, tags=["runs"])
    def stop_leftovers(who: me, ref: RUN_REF) -> Stopped:
        own_run(who, ref)
        with who.acting() as svc:
            return Stopped(stopped=svc.stop_leftovers(ref))

    @router.get("/runs/{ref}/inspect", response_model=Inspection, tags=["forensics"])
    def inspect(
        who: me, ref: RUN_REF, attempt: Annotated[int | None, Query(ge=1)] = None
    ) -> Inspection:
        return service.inspect_run(ref, attempt)

    @router.get("/diff", response_model=RunDiff, tags=["forensics"])
    def diff(who: me, a: RUN_REF, b: RUN_REF) -> RunDiff:
        return service.diff_runs(a, b)

    # -- logs ------------------------------------------------------------------------------
    @router.get(
        "/runs/{ref}/logs/{layer}",
        tags=["logs"],
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {"schema": LOG_EVENT}}}},
    )
    def logs(
        who: me,
        ref: RUN_REF,
        layer: LogLayer,
        offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
        attempt: Annotated[int | None, Query(ge=1)] = None,
        only_attempt: Annotated[str | None, Query(max_length=64)] = None,
        follow: bool = False,
        last_event_id: Annotated[
            int | None, Header(ge=0, le=MAX_OFFSET, description="resume here (wins over offset)")
        ] = None,
    ) -> StreamingResponse:
        """A log as Server-Sent Events: `log` events carry base64 bytes, each with the byte
        offset after them as its id (send it back as Last-Event-ID to go on from there); an
        `end` event says where the log stands (offset, attempt, whether it had ended). With
        `follow`, the stream stays open while the attempt runs (up to 30 s a request)."""
        if last_event_id is not None:
            offset = last_event_id
        # an unknown run or attempt is a 404 now, not a stream that breaks off once begun
        run = service.get_run(ref)
        found = service._attempt(run, attempt)
        # the stream stays with one attempt, whatever comes after; if a retry began since the
        # caller's last read (only_attempt is no longer current), it only says which
        began = attempt is None and only_attempt not in (None, found.id)
        pinned = None if began else found.number
        return StreamingResponse(
            _log_events(service, run.id, layer, offset, found, pinned, follow),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    # -- artifacts -----------------------------------------------------------------------
    @router.get(
        "/runs/{ref}/artifacts",
        tags=["runs"],
        response_class=FileResponse,
        responses={200: {"content": {"application/x-tar": {"schema": {"type": "string"}}}}},
    )
    def collect(
        who: me, ref: RUN_REF, attempt: Annotated[int | None, Query(ge=1)] = None
    ) -> FileResponse:
        """Collect an attempt's artifacts to the server (incrementally) and send them as a
        tar; the X-Orbit-Collect header holds what the collect found (files, bytes moved,
        whether every file matched the run's manifest)."""
        run = service.get_run(ref)
        found = service._attempt(run, attempt)
        cache = service.bundles_dir.parent / "collected" / run.id / str(found.number)
        with who.acting() as svc:
            result = svc.collect_run_artifacts(ref, cache, attempt)
        scratch = Path(tempfile.mkdtemp(prefix=".collect-", dir=service.bundles_dir.parent))
        archive = scratch / "artifacts.tar"
        import tarfile

        with tarfile.open(archive, "w") as tar:
            tar.add(cache, arcname=".")
        summary = result.model_dump(mode="json", exclude={"dest"})
        return FileResponse(
            archive,
            media_type="application/x-tar",
            headers={"X-Orbit-Collect": json.dumps(summary)},
            background=BackgroundTask(shutil.rmtree, scratch, ignore_errors=True),
        )

    # -- the audit trail -------------------------------------------------------------------
    @router.get("/audit", response_model=list[AuditEvent], tags=["audit"])
    def audit(
        who: me,
        run: Annotated[str | None, Query(max_length=64)] = None,
        limit: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    ) -> list[AuditEvent]:
        return service.audit(run, limit)

    @router.get("/audit/verify", response_model=ChainReport, tags=["audit"])
    def verify(who: me) -> ChainReport:
        check = service.verify_audit()
        return ChainReport(
            events=check.events,
            head=check.head,
            problems=list(check.problems),
            intact=check.intact,
        )

    # -- SSH hosts -------------------------------------------------------------------------
    @router.get("/hosts", response_model=list[HostRecord], tags=["hosts"])
    def list_hosts(who: me) -> list[HostRecord]:
        return service.list_hosts()

    @router.post("/hosts", response_model=HostRecord, status_code=201, tags=["hosts"])
    def add_host(who: me, body: NewHost) -> HostRecord:
        who.require("admin")
        with who.acting() as svc:
            return svc.add_host(body.spec, check=body.check)

    @router.get("/hosts/{name}", response_model=HostRecord, tags=["hosts"])
    def get_host(who: me, name: str) -> HostRecord:
        return service.get_host(name)

    @router.post("/hosts/{name}/check", response_model=HostCheck, tags=["hosts"])
    def check_host(who: me, name: str) -> HostCheck:
        who.require("admin")
        with who.acting() as svc:
            return svc.check_host(name)

    @router.delete("/hosts/{name}", response_model=Removed, tags=["hosts"])
    def remove_host(who: me, name: str) -> Removed:
        who.require("admin")
        with who.acting() as svc:
            return Removed(removed=name, stopped_attempts=svc.remove_host(name))

    # -- Slurm clusters --------------------------------------------------------------------
    @router.get("/clusters", response_model=list[ClusterRecord], tags=["clusters"])
    def list_clusters(who: me) -> list[ClusterRecord]:
        return service.list_clusters()

    @router.post("/clusters", response_model=ClusterRecord, status_code=201, tags=["clusters"])
    def add_cluster(who: me, body: NewCluster) -> ClusterRecord:
        who.require("admin")
        with who.acting() as svc:
            return svc.add_cluster(body.spec, check=body.check)

    @router.get("/clusters/{name}", response_model=ClusterRecord, tags=["clusters"])
    def get_cluster(who: me, name: str) -> ClusterRecord:
        return service.get_cluster(name)

    @router.post("/clusters/{name}/check", response_model=ClusterCheck, tags=["clusters"])
    def check_cluster(who: me, name: str, body: CheckCluster | None = None) -> ClusterCheck:
        who.require("admin")
        with who.acting() as svc:
            return svc.check_cluster(name, sweep=body.sweep if body else False)

    @router.delete("/clusters/{name}", response_model=Removed, tags=["clusters"])
    def remove_cluster(who: me, name: str) -> Removed:
        who.require("admin")
        with who.acting() as svc:
            return Removed(removed=name, stopped_attempts=svc.remove_cluster(name))

    # -- users and tokens ------------------------------------------------------------------
    @router.get("/users", response_model=list[UserRecord], tags=["users"])
    def list_users(who: me) -> list[UserRecord]:
        who.require("admin")
        return service.list_users()

    @router.post("/users", response_model=UserRecord, status_code=201, tags=["users"])
    def add_user(who: me, body: NewUser) -> UserRecord:
        who.require("admin")
        with who.acting() as svc:
            return svc.add_user(body.name, body.role)

    @router.delete("/users/{name}", response_model=UserRecord, tags=["users"])
    def remove_user(who: me, name: str) -> UserRecord:
        who.require("admin")
        with who.acting() as svc:
            return svc.remove_user(name)

    @router.get("/tokens", response_model=list[TokenRecord], tags=["users"])
    def list_tokens(
        who: me, user: Annotated[str | None, Query(max_length=64)] = None
    ) -> list[TokenRecord]:
        """The caller's own tokens; an admin's: everyone's, or one user's."""
        if not who.admin:
            if user not in (None, who.user.name):
                raise Forbidden(f"{who.user.name} may list only their own tokens")
            user = who.user.name
        return service.list_tokens(user)

    @router.post("/tokens", response_model=NewToken, status_code=201, tags=["users"])
    def create_token(who: me, body: NewTokenBody) -> NewToken:
        """A new token, shown in this answer only (the server keeps its hash)."""
        user = body.user or who.user.name
        if user != who.user.name:
            who.require("admin")
        with who.acting() as svc:
            return svc.create_token(user, body.name, body.expires)

    @router.delete("/tokens/{token_id}", response_model=TokenRecord, tags=["users"])
    def revoke_token(who: me, token_id: str) -> TokenRecord:
        found = service.store.get_token(token_id)
        if found.user != who.user.name:
            who.require("admin")
        with who.acting() as svc:
            return svc.revoke_token(token_id)

    # -- agent nodes -----------------------------------------------------------------------
    # /nodes/join-tokens first: /nodes/{ref} would take it for a node's name
    @router.post("/nodes/join-tokens", response_model=NewJoinToken, status_code=201, tags=["nodes"])
    def create_join_token(who: me, body: NewJoinTokenBody) -> NewJoinToken:
        """A token agents join with (`orbit agent --join-token`), shown in this answer only
        (the server keeps its hash). Nodes that join with it get its labels."""
        who.require("admin")
        with who.acting() as svc:
            return svc.create_join_token(body.labels, body.expires)

    @router.get("/nodes/join-tokens", response_model=list[JoinTokenRecord], tags=["nodes"])
    def list_join_tokens(who: me) -> list[JoinTokenRecord]:
        """Join tokens, never the tokens themselves."""
        who.require("admin")
        return service.list_join_tokens()

    @router.delete("/nodes/join-tokens/{token_id}", response_model=JoinTokenRecord, tags=["nodes"])
    def revoke_join_token(who: me, token_id: JOIN_ID) -> JoinTokenRecord:
        """No node joins with it from now on; nodes that joined with it are not touched."""
        who.require("admin")
        with who.acting() as svc:
            svc.revoke_join_token(token_id)
        return next(t for t in service.list_join_tokens() if t.id == token_id)

    @router.get("/runs/{ref}/explain", response_model=Explanation, tags=["scheduler"])
    def explain(who: me, ref: RUN_REF, replay: bool = False) -> Explanation:
        """The run's latest scheduler decision; `replay` makes it again from the stored
        snapshot and config and says whether it came out byte for byte the same."""
        return service.explain(ref, replay)

    @router.get("/queue", response_model=list[QueueEntry], tags=["scheduler"])
    def queue(who: me) -> list[QueueEntry]:
        """Agent-pool runs waiting to be placed, by tier and position, with their reasons."""
        return service.queue()

    @router.get("/quotas", response_model=list[QuotaView], tags=["scheduler"])
    def list_quotas(who: me) -> list[QuotaView]:
        return service.list_quotas()

    @router.put("/quotas/{scope}/{name}", response_model=QuotaView, tags=["scheduler"])
    def set_quota(who: me, scope: QUOTA_SCOPE, name: QUOTA_NAME, body: QuotaBody) -> QuotaView:
        """At most `gpus` GPUs at once for the user or experiment; `weight` its fair share."""
        who.require("admin")
        with who.acting() as svc:
            return svc.set_quota(scope, name, body.gpus, body.weight)

    @router.delete("/quotas/{scope}/{name}", response_model=list[QuotaView], tags=["scheduler"])
    def remove_quota(who: me, scope: QUOTA_SCOPE, name: QUOTA_NAME) -> list[QuotaView]:
        who.require("admin")
        with who.acting() as svc:
            svc.remove_quota(scope, name)
        return service.list_quotas()

    @router.post("/sched/simulate", response_model=Simulation, tags=["scheduler"])
    def simulate(who: me, body: SimulateBody) -> Simulation:
        """Replay recorded passes under another scheduler config; nothing is changed."""
        return service.simulate(body.since_s, body.config)

    @router.get("/nodes", response_model=list[NodeRecord], tags=["nodes"])
    def list_nodes(who: me) -> list[NodeRecord]:
        return service.list_nodes()

    @router.get("/nodes/{ref}", response_model=NodeRecord, tags=["nodes"])
    def get_node(who: me, ref: NODE_REF) -> NodeRecord:
        return service.get_node(ref)

    @router.post("/nodes/{ref}", response_model=NodeRecord, tags=["nodes"])
    def set_node(who: me, ref: NODE_REF, body: NodeSettings) -> NodeRecord:
        """Cordon or uncordon a node, or set how many attempts it runs at once (0: drain:
        no new work, and once what runs there ends the node is free for people)."""
        who.require("admin")
        with who.acting() as svc:
            return svc.set_node(ref, cordon=body.cordon, max_tasks=body.max_tasks)

    @router.post("/nodes/{ref}/revoke", response_model=NodeRecord, tags=["nodes"])
    def revoke_node(who: me, ref: NODE_REF) -> NodeRecord:
        """Refuse the node's credential from now on; its attempts are lost (and retried
        elsewhere, as their retry policy says)."""
        who.require("admin")
        with who.acting() as svc:
            return svc.revoke_node(ref)

    @router.delete("/nodes/{ref}", response_model=NodeRecord, tags=["nodes"])
    def remove_node(who: me, ref: NODE_REF, force: bool = False) -> NodeRecord:
        """Forget a node (the answer is it as it was). Refused while it runs attempts,
        unless `force` (they are lost)."""
        who.require("admin")
        with who.acting() as svc:
            return svc.remove_node(ref, force)

    @router.post("/nodes/{ref}/push", response_model=Pushed, tags=["nodes"])
    def push_file(
        who: me,
        ref: NODE_REF,
        file: Annotated[UploadFile, File(description="the file, at most 48 MiB")],
        dest: Annotated[str, Form(min_length=1, max_length=4096, description="under its work dir")],
    ) -> Pushed:
        """Write a file to `dest` under the node's work dir (its agent fetches it)."""
        who.require("admin")
        if "\x00" in dest:
            raise InvalidInput(f"dest: {NUL}")
        data = file.file.read(MAX_TRANSFER_BYTES + 1)
        if len(data) > MAX_TRANSFER_BYTES:
            raise InvalidInput(f"file: at most {MAX_TRANSFER_BYTES:,} bytes per push")
        node = service.get_node(ref)
        with who.acting() as svc:
            result = svc.push_file(node.id, data, dest)
        return Pushed(node=node.name, dest=dest, size=len(data), result=result)

    @router.get("/nodes/{ref}/pull", tags=["nodes"], response_class=Response, responses=OCTETS)
    def pull_file(who: me, ref: NODE_REF, path: NODE_PATH) -> Response:
        """A file from under the node's work dir, as it is there."""
        who.require("admin")
        with who.acting() as svc:
            data = svc.pull_file(ref, path)
        return Response(data, media_type="application/octet-stream")

    return router


async def _log_events(
    service: CoreControlService,
    ref: str,
    layer: LogLayer,
    offset: int,
    found: AttemptRecord,
    pinned: int | None,
    follow: bool,
) -> AsyncIterator[str]:
    """The events of one log stream (see the `logs` route): the bytes of attempt `pinned`
    from `offset`, or, with none pinned, only the `end` event naming the current attempt.
    Reads run in the thread pool, the waits between them do not hold a thread; an error once
    the stream began is an `error` event with the problem's detail."""
    if pinned is None:
        yield _end(offset, found.number, found.id, found.state.terminal)
        return
    deadline = time.monotonic() + FOLLOW_S
    quiet_since = time.monotonic()
    while True:
        try:
            chunk = await anyio.to_thread.run_sync(
                functools.partial(service.read_log, ref, layer, offset, pinned)
            )
        except OrbitError as exc:
            problem = {"detail": str(exc), "error": type(exc).__name__}
            yield f"event: error\ndata: {json.dumps(problem)}\n\n"
            return
        if chunk.data:
            for start in range(0, len(chunk.data), EVENT_BYTES):
                piece = chunk.data[start : start + EVENT_BYTES]
                offset += len(piece)
                text = base64.b64encode(piece).decode()
                yield f"id: {offset}\nevent: log\ndata: {text}\n\n"
            quiet_since = time.monotonic()
            continue
        if not follow or chunk.ended or time.monotonic() >= deadline:
            yield _end(chunk.offset, chunk.attempt, chunk.attempt_id, chunk.ended)
            return
        if time.monotonic() - quiet_since > 10:
            yield ": still here\n\n"  # keeps proxies from closing a quiet stream
            quiet_since = time.monotonic()
        await asyncio.sleep(0.25)


def _end(offset: int, attempt: int, attempt_id: str, ended: bool) -> str:
    data = json.dumps(
        {"offset": offset, "attempt": attempt, "attempt_id": attempt_id, "ended": ended}
    )
    return f"id: {offset}\nevent: end\ndata: {data}\n\n"
