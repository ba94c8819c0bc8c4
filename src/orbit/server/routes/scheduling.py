"""/api/v1 for the scheduler: why a run waits (explain), the queue, quotas, simulating another
config, and the config in force, and setting a new one (admins), which is validated before
anything is written: a refused one is one line naming the key (422)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import Field

from orbit.core.control.service import CoreControlService
from orbit.core.control.views import Explanation, QueueEntry, QuotaView, SchedConfigView, Simulation
from orbit.server.routes.common import RUN_REF, Body, api_router, me

QUOTA_SCOPE = Annotated[str, Field(pattern="^(user|experiment)$")]
QUOTA_NAME = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^/\x00]+$")]
MAX_CONFIG = 256 * 1024  # a scheduler config's text


class QuotaBody(Body):
    gpus: int = Field(ge=0, le=1_000_000, description="at most this many GPUs at once")
    weight: float = Field(default=1.0, gt=0, le=1000, description="fair-share weight")


class SimulateBody(Body):
    since_s: float = Field(gt=0, le=366 * 86400, description="replay the passes this far back")
    config: dict[str, Any] = Field(description="a scheduler config mapping to try")


class NewSchedConfig(Body):
    text: str = Field(max_length=MAX_CONFIG, description="the config as YAML")


def make_sched_router(service: CoreControlService) -> APIRouter:
    router = api_router()

    @router.get("/runs/{ref}/explain", response_model=Explanation, tags=["scheduler"])
    def explain(who: me, ref: RUN_REF, replay: bool = False) -> Explanation:
        """The run's latest scheduler decision; `replay` makes it again from the stored
        snapshot and config and says whether it came out byte for byte the same."""
        return service.explain(ref, replay)

    @router.get("/queue", response_model=list[QueueEntry], tags=["scheduler"])
    def queue(who: me) -> list[QueueEntry]:
        """Agent-pool runs waiting to be placed, by tier and position, with their reasons."""
        return who.seen(service.queue(), lambda e: e.run)

    @router.get("/quotas", response_model=list[QuotaView], tags=["scheduler"])
    def list_quotas(who: me) -> list[QuotaView]:
        return service.list_quotas()

    @router.put("/quotas/{scope}/{name}", response_model=QuotaView, tags=["scheduler"])
    def set_quota(who: me, scope: QUOTA_SCOPE, name: QUOTA_NAME, body: QuotaBody) -> QuotaView:
        """At most `gpus` GPUs at once for the user or experiment; `weight` its fair share."""
        with who.acting() as svc:
            return svc.set_quota(scope, name, body.gpus, body.weight)

    @router.delete("/quotas/{scope}/{name}", response_model=list[QuotaView], tags=["scheduler"])
    def remove_quota(who: me, scope: QUOTA_SCOPE, name: QUOTA_NAME) -> list[QuotaView]:
        with who.acting() as svc:
            svc.remove_quota(scope, name)
        return service.list_quotas()

    @router.post("/sched/simulate", response_model=Simulation, tags=["scheduler"])
    def simulate(who: me, body: SimulateBody) -> Simulation:
        """Replay recorded passes under another scheduler config; nothing is changed."""
        return service.simulate(body.since_s, body.config)

    @router.get("/sched/config", response_model=SchedConfigView, tags=["scheduler"])
    def show(who: me) -> SchedConfigView:
        """The live config (as written, and with every default filled in), where it came
        from, who set it and when, and a newer one that was refused, with why and since."""
        return service.scheduler_config_view()

    @router.put("/sched/config", response_model=SchedConfigView, tags=["scheduler"])
    def put(who: me, body: NewSchedConfig) -> SchedConfigView:
        """Validate a config and make it the live one: written to the server's config file
        and kept in the store, audited (`sched.config`) with the caller and the diff."""
        with who.acting() as svc:
            return svc.set_scheduler_config(body.text)

    return router
