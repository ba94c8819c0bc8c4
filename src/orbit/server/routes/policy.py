"""/api/v1/policy: the site's policy. Anyone signed in reads the policy in force and its
versions, and checks a file; only an admin replays one against past submissions (it names
users and their runs) or applies one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import Field

from orbit.core.control.service import CoreControlService
from orbit.core.control.views import PolicyReview
from orbit.model.policies import PolicyVersion
from orbit.policy.check import CheckReport
from orbit.policy.replay import DiffReport
from orbit.policy.rules import MAX_FILE_BYTES
from orbit.server.routes.common import Body, RowId, api_router, me

DAY_S = 86400


class PolicyText(Body):
    text: str = Field(max_length=MAX_FILE_BYTES)
    source: str = Field(default="policy", min_length=1, max_length=256)  # the file's name


class PolicyDiffAsk(PolicyText):
    since_s: float = Field(default=30 * DAY_S, gt=0, le=400 * DAY_S)


def make_policy_router(service: CoreControlService) -> APIRouter:
    router = api_router()

    @router.get("/policy", response_model=PolicyVersion, tags=["policy"])
    def show_policy(who: me) -> PolicyVersion:
        """The policy in force, with its file."""
        return service.show_policy()

    @router.get("/policy/versions", response_model=list[PolicyVersion], tags=["policy"])
    def policy_history(who: me) -> list[PolicyVersion]:
        """Every version applied, newest first, without their files."""
        return service.policy_history()

    @router.get("/policy/versions/{version}", response_model=PolicyVersion, tags=["policy"])
    def policy_version(who: me, version: RowId) -> PolicyVersion:
        return service.show_policy(version)

    @router.get("/policy/versions/{version}/review", response_model=PolicyReview, tags=["policy"])
    def review_policy(
        who: me, version: RowId, since_s: Annotated[float, Query(gt=0, le=400 * DAY_S)] = 30 * DAY_S
    ) -> PolicyReview:
        """A version as one document for a review: its file, its check, and its diff against
        the version before it over the submissions before it was applied (admins)."""
        from datetime import timedelta

        return service.review_policy(version, timedelta(seconds=since_s))

    @router.post("/policy/check", response_model=CheckReport, tags=["policy"])
    def check_policy(who: me, body: PolicyText) -> CheckReport:
        """Read, compile and type-check a file and run its own tests; applies nothing."""
        return service.check_policy(body.text, body.source)

    @router.post("/policy/diff", response_model=DiffReport, tags=["policy"])
    def diff_policy(who: me, body: PolicyDiffAsk) -> DiffReport:
        """What a file would change against the submissions of the last `since_s` seconds."""
        from datetime import timedelta

        return service.diff_policy(body.text, body.source, timedelta(seconds=body.since_s))

    @router.post("/policy/versions", response_model=PolicyVersion, status_code=201, tags=["policy"])
    def apply_policy(who: me, body: PolicyText) -> PolicyVersion:
        """Apply a file as the next version, in force from the next submit (admins)."""
        with who.acting() as svc:
            return svc.apply_policy(body.text, body.source)

    return router
