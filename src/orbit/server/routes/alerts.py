"""/api/v1/alerts: the server's alerts. Anyone signed in lists them and reads the Prometheus
rules; only an admin acknowledges or silences one."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse
from pydantic import Field

from orbit.core.control.alerts import prometheus_rules
from orbit.core.control.service import CoreControlService
from orbit.model.alerts import AlertRecord
from orbit.server.config import ServerConfig
from orbit.server.routes.common import Body, RowId, api_router, me


class Silence(Body):
    for_s: float = Field(gt=0, le=90 * 86400)


def make_alerts_router(service: CoreControlService, config: ServerConfig) -> APIRouter:
    router = api_router()

    @router.get("/alerts", response_model=list[AlertRecord], tags=["alerts"])
    def list_alerts(who: me, all: Annotated[bool, Query()] = False) -> list[AlertRecord]:
        """Open alerts, newest first; with `all`, resolved ones too (the last 500). Not those
        about the runs of a restricted experiment the caller is not a member of."""
        return who.seen(service.list_alerts(all), lambda a: a.objects.get("run"))

    @router.post("/alerts/{alert_id}/ack", response_model=AlertRecord, tags=["alerts"])
    def acknowledge_alert(who: me, alert_id: RowId) -> AlertRecord:
        with who.acting() as svc:
            return svc.acknowledge_alert(alert_id)

    @router.post("/alerts/{alert_id}/silence", response_model=AlertRecord, tags=["alerts"])
    def silence_alert(who: me, alert_id: RowId, body: Silence) -> AlertRecord:
        """No delivery about it for `for_s` seconds (its resolution included)."""
        with who.acting() as svc:
            return svc.silence_alert(alert_id, timedelta(seconds=body.for_s))

    @router.get(
        "/alerts/rules",
        response_class=PlainTextResponse,
        tags=["alerts"],
        responses={200: {"content": {"text/plain": {}}}},
    )
    def alert_rules(who: me) -> PlainTextResponse:
        """The conditions /metrics shows, as a Prometheus rules file, with this server's
        thresholds."""
        return PlainTextResponse(prometheus_rules(config.alerts))

    return router
