"""The console's alerts page: what the server's loop has open (or, asked, every one of the last
500), each with its severity, what it concerns, what is wrong and the remedy; and the forms that
acknowledge one or silence it for a while (alerts.manage, as the API's routes)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from orbit.core.control.service import CoreControlService
from orbit.model.durations import parse_duration
from orbit.model.errors import OrbitError
from orbit.server.routes.common import RowId, me
from orbit.server.ui.actions import back, csrf_checked, refused
from orbit.server.ui.common import console_router, context, guarded
from orbit.server.ui.render import page
from orbit.server.ui.session import PREFIX


def make_alert_pages(service: CoreControlService) -> APIRouter:
    router = console_router()

    @router.get("/alerts")
    @guarded
    def alerts(request: Request, who: me) -> Response:
        every = request.query_params.get("all") == "1"
        found = who.seen(service.list_alerts(every), lambda a: a.objects.get("run"))
        return page("alerts.html", **context(request, who, "alerts", alerts=found, every=every))

    @router.post("/alerts/{alert_id}/ack")
    async def alert_ack(request: Request, who: me, alert_id: RowId) -> Response:
        try:
            await csrf_checked(request)
            with who.acting() as acting:
                acting.acknowledge_alert(alert_id)
        except OrbitError as exc:
            return refused(request, who, exc)
        return back(f"{PREFIX}/alerts", f"alert {alert_id} acknowledged")

    @router.post("/alerts/{alert_id}/silence")
    async def alert_silence(request: Request, who: me, alert_id: RowId) -> Response:
        try:
            form = await csrf_checked(request)
            span = form.get("for") or "1h"
            with who.acting() as acting:
                acting.silence_alert(alert_id, parse_duration(span, "for"))
        except OrbitError as exc:
            return refused(request, who, exc)
        return back(f"{PREFIX}/alerts", f"alert {alert_id} silenced for {span}")

    return router
