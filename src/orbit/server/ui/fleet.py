"""The console's pages about the fleet and the team: nodes (and SSH hosts and Slurm clusters
beside them), one node's facts and attempts, fair share (GPUs in use against quota, per user and
experiment, as CSV too), the audit trail with its chain's check, and the admin's users and
tokens. Reads go through the control service, acting for the caller."""

from __future__ import annotations

import csv
import io
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from orbit.core.control.service import CoreControlService
from orbit.scheduler.gpu_hours import GpuHours
from orbit.server.agents.mailbox import Heartbeats
from orbit.server.routes.common import me
from orbit.server.ui.common import (
    FILE_HEADERS,
    BadQuery,
    attachment,
    console_router,
    context,
    guarded,
    whole,
)
from orbit.server.ui.render import page

MAX_DAYS = 90  # the longest period fair share sums (every attempt in it is read)
HOURS_FRESH_S = 60.0  # a period's GPU-hours are summed again at most this often


class RecentHours:
    """GPU-hours per period, kept a minute: a page reloaded, or many people looking, cost one
    read of the period's attempts a minute, not one each."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[float, GpuHours]] = {}
        self._lock = threading.Lock()

    def get(self, who: Any, days: int) -> GpuHours:
        with self._lock:
            kept = self._kept.get(days)
            if kept is not None and time.monotonic() - kept[0] < HOURS_FRESH_S:
                return kept[1]
            until = datetime.now(UTC)
            with who.acting() as acting:
                hours: GpuHours = acting.gpu_hours(
                    until - timedelta(days=days), until, steps=min(days * 4, 60)
                )
            self._kept[days] = (time.monotonic(), hours)
            return hours


def make_fleet_pages(service: CoreControlService, beats: Heartbeats) -> APIRouter:
    router = console_router()
    recent = RecentHours()

    @router.get("/nodes")
    @guarded
    def nodes(request: Request, who: me) -> Response:
        with who.acting() as acting:
            found = acting.list_nodes()
            hosts = acting.list_hosts()
            clusters = acting.list_clusters()
        now, util = datetime.now(UTC), beats.last_utilization()
        rows = [
            {
                "node": n,
                "condition": n.condition(now),
                "gpus": _gpus(n.info),
                "util": util.get(n.id, {}),
                "spark": _spark(beats.utilization_history(n.id)),
            }
            for n in found
        ]
        return page(
            "nodes.html",
            **context(request, who, "nodes", rows=rows, hosts=hosts, clusters=clusters),
        )

    @router.get("/nodes/{name}")
    @guarded
    def node(request: Request, who: me, name: str) -> Response:
        with who.acting() as acting:
            found = acting.get_node(name)
            runs = acting.run_page(node=found.name, limit=50, viewer=who.viewer)
        return page(
            "node.html",
            **context(
                request,
                who,
                "nodes",
                node=found,
                condition=found.condition(datetime.now(UTC)),
                gpus=_gpus(found.info),
                util=beats.last_utilization().get(found.id, {}),
                spark=_spark(beats.utilization_history(found.id)),
                runs=runs,
            ),
        )

    @router.get("/fair-share")
    @guarded
    def fair_share(request: Request, who: me) -> Response:
        error = None
        try:
            days = whole(request.query_params.get("days"), "days", default=7, high=MAX_DAYS)
        except BadQuery as exc:
            error, days = str(exc), 7
        hours = recent.get(who, days)
        rows, quotas = _shares(who, hours)
        if request.query_params.get("format") == "csv":
            return _csv(rows)
        chart = [hours.steps, *hours.per_step.values()]
        values = context(
            request,
            who,
            "fair-share",
            rows=rows,
            quotas=quotas,
            days=days,
            error=error,
            chart=chart,
            chart_users=list(hours.per_step),
        )
        return page("fair_share.html", **values)

    @router.get("/audit")
    @guarded
    def audit(request: Request, who: me) -> Response:
        q = request.query_params
        error = None
        try:
            limit = whole(q.get("limit"), "limit", default=200, high=5000)
        except BadQuery as exc:
            error, limit = str(exc), 200
        run = q.get("run") or None
        actor, action = q.get("actor") or None, q.get("action") or None
        with who.acting() as acting:
            if run is not None:
                who.see_run(run)
            events = who.seen(acting.audit(run=run, limit=limit), lambda e: e.run_id)
            check = acting.verify_audit() if q.get("verify") == "1" else None
        events = [
            e
            for e in reversed(events)
            if (actor is None or e.actor == actor) and (action is None or e.action == action)
        ]
        if q.get("format") == "jsonl":
            body = "".join(e.model_dump_json() + "\n" for e in events)
            return Response(
                body,
                media_type="application/x-ndjson",
                headers={**FILE_HEADERS, "Content-Disposition": attachment("orbit-audit.jsonl")},
            )
        return page(
            "audit.html",
            **context(
                request,
                who,
                "audit",
                events=events,
                check=check,
                error=error,
                limit=limit,
                run=run or "",
                actor=actor or "",
                action=action or "",
            ),
        )

    @router.get("/admin")
    @guarded
    def admin(request: Request, who: me) -> Response:
        with who.acting() as acting:
            users = acting.list_users()
            tokens = acting.list_tokens()
            joins = acting.list_join_tokens()
            quotas = acting.list_quotas()
        return page(
            "admin.html",
            **context(
                request, who, "admin", users=users, tokens=tokens, joins=joins, quotas=quotas
            ),
        )

    return router


def _gpus(info: dict[str, Any]) -> list[dict[str, Any]]:
    """A node's GPUs as its agent reports them (model, memory, utilization now if known)."""
    found = info.get("accelerators") or []
    return [g for g in found if isinstance(g, dict)]


def _spark(history: list[tuple[float, dict[int, float]]]) -> list[list[float | None]]:
    """[times, mean GPU utilization %] over the last hour, for a sparkline."""
    times = [t for t, _ in history]
    means = [round(sum(u.values()) / len(u), 1) if u else None for _, u in history]
    return [times, means]  # type: ignore[list-item]


def _shares(who: Any, hours: GpuHours) -> tuple[list[dict[str, Any]], list[Any]]:
    """Per user and experiment: GPUs held by their runs that run now, their quota, their
    share of all GPUs held (the dominant share, as the scheduler's fair share counts GPUs),
    and their GPU-hours over the period."""
    with who.acting() as acting:
        holding = acting.gpus_held()
        quotas = acting.list_quotas()
    held: dict[tuple[str, str], int] = {}
    runs: dict[tuple[str, str], int] = {}
    for user, experiment, gpus in holding:
        for key in (("user", user), ("experiment", experiment)):
            held[key] = held.get(key, 0) + gpus
            runs[key] = runs.get(key, 0) + 1
    limits = {(q.scope, q.name): q for q in quotas}
    total = sum(v for (scope, _), v in held.items() if scope == "user") or 0
    rows = []
    spent = {("user", u) for u in hours.users} | {("experiment", e) for e in hours.experiments}
    for key in sorted(set(held) | set(limits) | spent):
        quota = limits.get(key)
        rows.append(
            {
                "scope": key[0],
                "name": key[1],
                "gpus": held.get(key, 0),
                "runs": runs.get(key, 0),
                "quota": quota.gpus if quota else None,
                "weight": quota.weight if quota else 1.0,
                "share": (held.get(key, 0) / total) if total else 0.0,
                "gpu_hours": round(
                    (hours.users if key[0] == "user" else hours.experiments).get(key[1], 0.0), 2
                ),
            }
        )
    return rows, quotas


def _csv(rows: list[dict[str, Any]]) -> Response:
    out = io.StringIO()
    fields = ["scope", "name", "gpus", "runs", "quota", "weight", "gpu_hours"]
    writer = csv.DictWriter(out, fieldnames=fields)
    writer.writeheader()
    for row in rows:
        writer.writerow({k: row[k] for k in writer.fieldnames})
    return Response(
        out.getvalue(),
        media_type="text/csv",
        headers={**FILE_HEADERS, "Content-Disposition": attachment("orbit-fair-share.csv")},
    )
