"""/api/v1 for storage: collect (served from the control plane's one copy, only what the client
lacks), pin and unpin, delete runs, gc and usage. Each route checks the caller's role and
calls the control service acting for them (orbit.core.control.storage)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from pydantic import Field

from orbit.core.control.service import CoreControlService
from orbit.core.storage.wire import Have, Partial, tar_stream
from orbit.model.storage import GcReport, RunStorage, Usage
from orbit.server.auth import Caller
from orbit.server.routes.common import RUN_REF, Body, api_router, me
from orbit.server.waiting import on_slow_threads

TAR: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"application/x-tar": {"schema": {"type": "string"}}},
        "headers": {
            "X-Orbit-Collect": {
                "description": "JSON: attempt, files, bytes, moved, problems, removed, roots",
                "schema": {"type": "string"},
            }
        },
    }
}
MAX_FILES = 1_000_000  # files a client may say it has


class CollectAsk(Body):
    attempt: int | None = Field(default=None, ge=1, description="default: the current one")
    have: list[Have] = Field(
        default=[], max_length=MAX_FILES, description="files at the destination already"
    )
    partial: list[Partial] = Field(
        default=[], max_length=MAX_FILES, description="files a cut transfer left half-written"
    )


class DeleteRuns(Body):
    runs: list[RUN_REF] = Field(min_length=1, max_length=1000)
    dry_run: bool = False


class GcAsk(Body):
    dry_run: bool = False


def make_storage_router(service: CoreControlService) -> APIRouter:
    router = api_router()

    def collected(who: Caller, ref: str, ask: CollectAsk) -> StreamingResponse:
        with who.acting() as svc:
            plan = svc.plan_collect(ref, ask.attempt, ask.have, ask.partial)
        return StreamingResponse(
            tar_stream(plan.items),
            media_type="application/x-tar",
            headers={"X-Orbit-Collect": json.dumps(plan.summary)},
        )

    @router.get(
        "/runs/{ref}/artifacts", tags=["runs"], response_class=StreamingResponse, responses=TAR
    )
    @on_slow_threads  # it may wait for a node, a host or the disk
    def collect_all(
        who: me, ref: RUN_REF, attempt: Annotated[int | None, Query(ge=1)] = None
    ) -> StreamingResponse:
        """An attempt's artifacts as a tar, all of them, from the control plane's copy (a
        node asked for what it held back, an SSH host's brought in first); the
        X-Orbit-Collect header says what there is and what kept it from being whole."""
        return collected(who, ref, CollectAsk(attempt=attempt))

    @router.post(
        "/runs/{ref}/artifacts", tags=["runs"], response_class=StreamingResponse, responses=TAR
    )
    @on_slow_threads  # it may wait for a node, a host or the disk
    def collect(who: me, ref: RUN_REF, body: CollectAsk | None = None) -> StreamingResponse:
        """Only what the client lacks: files it does not have with that size and sha256,
        and the rest of those a cut transfer left half-written (a member with the
        ORBIT.offset PAX header holds a file's bytes from that offset on)."""
        return collected(who, ref, body or CollectAsk())

    @router.get("/runs/{ref}/storage", response_model=RunStorage, tags=["storage"])
    def run_storage(who: me, ref: RUN_REF) -> RunStorage:
        return service.run_storage(ref)

    @router.post("/runs/{ref}/pin", response_model=RunStorage, tags=["storage"])
    def pin(who: me, ref: RUN_REF) -> RunStorage:
        """Retention and gc never touch a pinned run; it cannot be deleted until unpinned."""
        with who.acting() as svc:
            return svc.pin_run(ref, True)

    @router.delete("/runs/{ref}/pin", response_model=RunStorage, tags=["storage"])
    def unpin(who: me, ref: RUN_REF) -> RunStorage:
        with who.acting() as svc:
            return svc.pin_run(ref, False)

    @router.post("/runs/delete", response_model=GcReport, tags=["storage"])
    @on_slow_threads  # it may wait for a node, a host or the disk
    def delete_runs(who: me, body: DeleteRuns) -> GcReport:
        """Remove runs' artifacts (server and nodes) and the bundles no other run uses; the
        runs' records and audit trails stay, marked deleted. All or nothing: refused (409)
        if one is pinned or running, or not the caller's (403, unless an admin)."""
        for ref in body.runs:
            who.require_run(who.see_run(ref), "storage.keep")
        with who.acting() as svc:
            return svc.delete_runs(body.runs, dry_run=body.dry_run)

    @router.post("/gc", response_model=GcReport, tags=["storage"])
    @on_slow_threads  # it may wait for a node, a host or the disk
    def gc(who: me, body: GcAsk | None = None) -> GcReport:
        """Apply the server's retention rules now and remove what nothing refers to
        (admins); `dry_run`: say what would go."""
        with who.acting() as svc:
            return svc.collect_garbage(dry_run=(body or GcAsk()).dry_run)

    @router.get("/usage", response_model=Usage, tags=["storage"])
    def usage(who: me) -> Usage:
        """Bytes on the control plane by user and experiment: artifacts and bundles."""
        return service.usage()

    return router
