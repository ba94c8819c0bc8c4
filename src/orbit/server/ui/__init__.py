"""The web console under /ui/, served by `orbit server`: pages rendered here (Jinja2, htmx for
the parts that change, Server-Sent Events for the live ones, uPlot's charts), its static files
vendored (static/vendor/VENDORED.md), sign-in by token into a session cookie (session.py).

May import what orbit.server may."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from orbit.core.control.service import CoreControlService
from orbit.server.agents.mailbox import Heartbeats
from orbit.server.routes.common import ConsoleRefused, caller
from orbit.server.ui.common import error_page

STATIC = Path(__file__).parent / "static"


def install_console(app: FastAPI, service: CoreControlService, beats: Heartbeats) -> None:
    """The console's routes, its files, and POST /api/v1/ui/links (`orbit ui`)."""
    from orbit.server.ui.actions import make_action_pages, make_link_route
    from orbit.server.ui.admin import make_admin_pages
    from orbit.server.ui.alerts import make_alert_pages
    from orbit.server.ui.files import make_file_pages
    from orbit.server.ui.fleet import make_fleet_pages
    from orbit.server.ui.live import make_live_pages
    from orbit.server.ui.runs import make_runs_pages
    from orbit.server.ui.session import SignInLinks

    links = SignInLinks()
    routers: list[APIRouter] = [
        make_link_route(links),
        make_action_pages(service, links),
        make_admin_pages(service),
        make_alert_pages(service),
        make_live_pages(service),
        make_file_pages(service),
        make_fleet_pages(service, beats),
        make_runs_pages(service),
    ]
    for router in routers:
        app.include_router(router)

    @app.exception_handler(ConsoleRefused)
    async def refused(request: Request, exc: ConsoleRefused) -> Response:
        """A page the user's role does not open: the console's error page, not a problem."""
        return error_page(request, caller(request), exc.status, str(exc))

    app.mount("/ui/static", ConsoleFiles(directory=STATIC), name="console-static")


class ConsoleFiles(StaticFiles):
    """The console's own files: the vendored ones (pinned) kept a day by the browser, the
    console's script and styles asked again each time (answered 304 while unchanged)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        if response.status_code in (200, 304):
            pinned = path.startswith("vendor/")
            response.headers["Cache-Control"] = "public, max-age=86400" if pinned else "no-cache"
            response.headers["X-Content-Type-Options"] = "nosniff"
        return response
