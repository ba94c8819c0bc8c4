"""The web console under /ui/, served by `orbit server`: pages rendered here (Jinja2, htmx for
the parts that change, Server-Sent Events for the live ones, uPlot's charts), its static files
vendored (static/vendor/VENDORED.md), sign-in by token into a session cookie (session.py).

May import what orbit.server may."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from starlette.staticfiles import StaticFiles

from orbit.core.control.service import CoreControlService
from orbit.server.agents.mailbox import Heartbeats

STATIC = Path(__file__).parent / "static"


def install_console(app: FastAPI, service: CoreControlService, beats: Heartbeats) -> None:
    """The console's routes, its files, and POST /api/v1/ui/links (`orbit ui`)."""
    from orbit.server.ui.actions import make_action_pages, make_link_route
    from orbit.server.ui.admin import make_admin_pages
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
        make_live_pages(service),
        make_file_pages(service),
        make_fleet_pages(service, beats),
        make_runs_pages(service),
    ]
    for router in routers:
        app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="console-static")
