"""/api/v1/templates and /api/v1/experiments: the templates runs are made from, and the
experiments that group them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import Field

from orbit.core.control.service import CoreControlService
from orbit.core.control.views import TemplateView
from orbit.model.errors import NotFound
from orbit.model.records import ExperimentRecord
from orbit.server.auth import Caller
from orbit.server.routes.common import Body, api_router, me


class NewExperiment(Body):
    name: str = Field(min_length=1, max_length=128)


ExperimentName = Annotated[str, Path(min_length=1, max_length=128)]
UserName = Annotated[str, Field(min_length=1, max_length=64)]


class ExperimentChange(Body):
    restricted: bool | None = Field(default=None, description="only its members see its runs")
    add: list[UserName] = Field(default=[], max_length=1000, description="members to add")
    remove: list[UserName] = Field(default=[], max_length=1000, description="members to remove")


def seen(who: Caller, found: ExperimentRecord, name: str) -> ExperimentRecord:
    if found.id in who.hidden:
        raise NotFound(f"unknown experiment '{name}' (see 'orbit experiments list')")
    return found


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
        """Those the caller sees: a restricted one only by its members (and managers)."""
        return service.list_experiments(who.viewer)

    @router.get("/experiments/{name}", response_model=ExperimentRecord, tags=["catalogue"])
    def get_experiment(who: me, name: ExperimentName) -> ExperimentRecord:
        return seen(who, service.get_experiment(name), name)

    @router.patch("/experiments/{name}", response_model=ExperimentRecord, tags=["catalogue"])
    def set_experiment(who: me, name: ExperimentName, body: ExperimentChange) -> ExperimentRecord:
        """Restrict an experiment to its members (only they, and those who manage experiments,
        see its runs, logs and artifacts), or open it; add or remove members (audited)."""
        with who.acting() as svc:
            return svc.set_experiment(name, body.restricted, body.add, body.remove)

    @router.post(
        "/experiments", response_model=ExperimentRecord, status_code=201, tags=["catalogue"]
    )
    def create_experiment(who: me, body: NewExperiment) -> ExperimentRecord:
        with who.acting() as svc:
            return svc.create_experiment(body.name)

    return router
