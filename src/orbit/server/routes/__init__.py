"""/api/v1: everything the CLI does, over HTTP, one router per resource. Each route checks what
the caller's role allows and calls the control service acting for the caller; nothing here
decides anything else. A route that may block for long (on a host, a node, a big upload) runs
on the slow requests' threads (waiting.py), so that it cannot take every thread the quick ones
need.

May import what orbit.server may."""

from __future__ import annotations

from fastapi import APIRouter

from orbit.core.control.service import CoreControlService
from orbit.server.config import ServerConfig
from orbit.server.metrics import Metrics
from orbit.server.routes.accounts import make_accounts_router
from orbit.server.routes.alerts import make_alerts_router
from orbit.server.routes.audit import make_audit_router
from orbit.server.routes.catalogue import make_catalogue_router
from orbit.server.routes.groups import make_groups_router
from orbit.server.routes.hosts import make_hosts_router
from orbit.server.routes.logs import make_logs_router
from orbit.server.routes.nodes import make_nodes_router
from orbit.server.routes.policy import make_policy_router
from orbit.server.routes.runs import make_runs_router
from orbit.server.routes.scheduling import make_sched_router
from orbit.server.routes.secrets import make_secrets_router
from orbit.server.routes.storage import make_storage_router


def api_routers(
    service: CoreControlService, config: ServerConfig, metrics: Metrics
) -> list[APIRouter]:
    """The routers of /api/v1, in the order they match (a router's fixed paths, such as
    /nodes/join-tokens, before its own /nodes/{ref})."""
    return [
        make_accounts_router(service),
        make_secrets_router(service),
        make_policy_router(service),
        make_alerts_router(service, config),
        make_catalogue_router(service),
        make_runs_router(service, config, metrics),
        make_groups_router(service, config, metrics),
        make_logs_router(service),
        make_audit_router(service),
        make_hosts_router(service),
        make_sched_router(service),
        make_nodes_router(service),
        make_storage_router(service),
    ]
