"""/api/v1/audit: the audit trail, and checking that its hash chain is intact."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel

from orbit.core.control.service import CoreControlService
from orbit.model.audit_chain import Anchor
from orbit.model.records import AuditEvent
from orbit.server.routes.common import api_router, me


class ChainReport(BaseModel):
    events: int
    head: str | None
    problems: list[str]
    intact: bool
    keyed_from: int | None = None
    key_id: str | None = None


def make_audit_router(service: CoreControlService) -> APIRouter:
    router = api_router()

    # -- the audit trail -------------------------------------------------------------------
    @router.get("/audit", response_model=list[AuditEvent], tags=["audit"])
    def audit(
        who: me,
        run: Annotated[str | None, Query(max_length=64)] = None,
        limit: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    ) -> list[AuditEvent]:
        """The newest `limit` events (of a run), oldest first; not those about the runs of a
        restricted experiment the caller is not a member of."""
        if run is not None:
            who.see_run(run)
        return who.seen(service.audit(run, limit), lambda e: e.run_id)

    @router.get("/audit/verify", response_model=ChainReport, tags=["audit"])
    def verify(
        who: me, anchor: Annotated[list[str] | None, Query(description="ID:HASH")] = None
    ) -> ChainReport:
        check = service.verify_audit([Anchor.parse(a) for a in anchor or ()])
        return ChainReport(
            events=check.events,
            head=check.head,
            problems=list(check.problems),
            intact=check.intact,
            keyed_from=check.keyed_from,
            key_id=check.key_id,
        )

    return router
