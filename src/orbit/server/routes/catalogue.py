"""/api/v1/templates and /api/v1/experiments: the templates runs are made from, and the
experiments that group them."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import Field

from orbit.core.control.service import CoreControlService
from orbit.core.control.views import TemplateView
from orbit.model.records import ExperimentRecord
from orbit.server.routes.common import Body, api_router, me


class NewExperiment(Body):
    name: str = Field(min_length=1, max_length=128)


def make_catalogue_router(service: CoreControlService) -> APIRouter:
    router = api_router()

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

    return router
