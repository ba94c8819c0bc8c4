"""/api/v1/hosts and /api/v1/clusters: the SSH hosts and Slurm clusters runs may execute on,
added, checked and removed by admins."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from orbit.core.control.service import CoreControlService
from orbit.core.control.views import HostCheck
from orbit.model.clusters import ClusterCheck, ClusterRecord, ClusterSpec
from orbit.model.hosts import HostRecord, HostSpec
from orbit.server.routes.common import Body, api_router, me
from orbit.server.waiting import on_slow_threads


class NewHost(Body):
    spec: HostSpec
    check: bool = True


class NewCluster(Body):
    spec: ClusterSpec
    check: bool = True


class CheckCluster(Body):
    sweep: bool = False  # cancel this control plane's ORBIT jobs that no live attempt owns


class Removed(BaseModel):
    removed: str
    stopped_attempts: list[str] = []


def make_hosts_router(service: CoreControlService) -> APIRouter:
    router = api_router()

    # -- SSH hosts -------------------------------------------------------------------------
    @router.get("/hosts", response_model=list[HostRecord], tags=["hosts"])
    def list_hosts(who: me) -> list[HostRecord]:
        return service.list_hosts()

    @router.post("/hosts", response_model=HostRecord, status_code=201, tags=["hosts"])
    @on_slow_threads
    def add_host(who: me, body: NewHost) -> HostRecord:
        with who.acting() as svc:
            return svc.add_host(body.spec, check=body.check)

    @router.get("/hosts/{name}", response_model=HostRecord, tags=["hosts"])
    def get_host(who: me, name: str) -> HostRecord:
        return service.get_host(name)

    @router.post("/hosts/{name}/check", response_model=HostCheck, tags=["hosts"])
    @on_slow_threads
    def check_host(who: me, name: str) -> HostCheck:
        with who.acting() as svc:
            return svc.check_host(name)

    @router.delete("/hosts/{name}", response_model=Removed, tags=["hosts"])
    @on_slow_threads
    def remove_host(who: me, name: str) -> Removed:
        with who.acting() as svc:
            return Removed(removed=name, stopped_attempts=svc.remove_host(name))

    # -- Slurm clusters --------------------------------------------------------------------
    @router.get("/clusters", response_model=list[ClusterRecord], tags=["clusters"])
    def list_clusters(who: me) -> list[ClusterRecord]:
        return service.list_clusters()

    @router.post("/clusters", response_model=ClusterRecord, status_code=201, tags=["clusters"])
    @on_slow_threads
    def add_cluster(who: me, body: NewCluster) -> ClusterRecord:
        with who.acting() as svc:
            return svc.add_cluster(body.spec, check=body.check)

    @router.get("/clusters/{name}", response_model=ClusterRecord, tags=["clusters"])
    def get_cluster(who: me, name: str) -> ClusterRecord:
        return service.get_cluster(name)

    @router.post("/clusters/{name}/check", response_model=ClusterCheck, tags=["clusters"])
    @on_slow_threads
    def check_cluster(who: me, name: str, body: CheckCluster | None = None) -> ClusterCheck:
        with who.acting() as svc:
            return svc.check_cluster(name, sweep=body.sweep if body else False)

    @router.delete("/clusters/{name}", response_model=Removed, tags=["clusters"])
    @on_slow_threads
    def remove_cluster(who: me, name: str) -> Removed:
        with who.acting() as svc:
            return Removed(removed=name, stopped_attempts=svc.remove_cluster(name))

    return router
