"""The console's pages about runs: the overview, the runs list (filters, pages newest first by a
cursor, rows that update live), a run (attempts, progress, charts, logs, request, provenance,
audit, inspect) and the queue with each waiting run's decision. Every read goes through the
control service, acting for the caller, as the API's routes do."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from orbit.core.control.service import CoreControlService
from orbit.core.control.views import RunPage
from orbit.forensics.series import ZOOM_MAX_S
from orbit.model.errors import NotFound
from orbit.model.layers import LogLayer
from orbit.model.models import RunState
from orbit.scheduler import explain
from orbit.server.routes.common import me
from orbit.server.ui.common import BadQuery, choice, console_router, context, guarded, whole
from orbit.server.ui.render import page

PAGE = 50
COUNTED = 1000  # a listing counts its matches up to this many ("more than 1,000" beyond)
ACTIVE = {s for s in RunState if not s.terminal}


def make_runs_pages(service: CoreControlService) -> APIRouter:
    router = console_router()

    @router.get("")
    def root() -> Response:
        return RedirectResponse("/ui/", status_code=308)

    @router.get("/")
    @guarded
    def overview(request: Request, who: me) -> Response:
        with who.acting() as acting:
            seen, cap = who.viewer, COUNTED
            running = acting.run_page(
                states={RunState.RUNNING}, limit=10, count_cap=cap, viewer=seen
            )
            failed = acting.run_page(states={RunState.FAILED}, limit=5, count_cap=cap, viewer=seen)
            waiting = who.seen(acting.queue(), lambda e: e.run)
            nodes = acting.list_nodes()
        now = _now()
        conditions: dict[str, int] = {}
        attention = []  # nodes a person should look at: gone silent, or a GPU unwell
        for node in nodes:
            word = node.condition(now).split(" ")[0]
            conditions[word] = conditions.get(word, 0) + 1
            sick = [g for g in node.info.get("accelerators") or [] if not g.get("healthy", True)]
            if word in ("offline", "revoked") or sick:
                why = word if not sick else f"GPU {sick[0].get('index')}: {sick[0].get('problem')}"
                attention.append((node.name, why))
        return page(
            "overview.html",
            **context(
                request,
                who,
                "overview",
                running=running,
                failed=failed,
                attention=attention,
                waiting=waiting[:10],
                waiting_total=len(waiting),
                conditions=sorted(conditions.items()),
                nodes_total=len(nodes),
            ),
        )

    @router.get("/runs")
    @guarded
    def runs(request: Request, who: me) -> Response:
        values = _listing(service, request, who)
        return page("runs.html", **context(request, who, "runs", **values))

    @router.get("/runs/rows")
    @guarded
    def rows(request: Request, who: me) -> Response:
        """The runs table's rows alone: what htmx swaps in when something changed."""
        values = _listing(service, request, who)
        return page("run_rows.html", **context(request, who, "runs", **values))

    @router.get("/runs/{ref}")
    @guarded
    def run(request: Request, who: me, ref: str) -> Response:
        with who.acting() as acting:
            view = acting.run_view(ref, refresh=False)
            events = acting.audit(run=view.run.id, limit=200)
            inspection = None
            if view.run.state is RunState.FAILED and who.refusal(view.run, "logs.read") is None:
                inspection = acting.inspect_run(view.run.id)
        run = view.run
        return page(
            "run.html",
            **context(
                request,
                who,
                "runs",
                view=view,
                run=run,
                events=events,
                inspection=inspection,
                layers=[LogLayer.TRAINING.value, LogLayer.RUNTIME.value],  # the task first
                can_cancel=who.refusal(run, "runs.cancel") is None,
                can_retry=who.refusal(run, "runs.retry") is None,
                request_json=run.request.model_dump(mode="json"),
                submission_json=run.submission.model_dump(mode="json"),
                live=not run.state.terminal,
                zoom_max_min=int(ZOOM_MAX_S // 60),
            ),
        )

    @router.get("/runs/{ref}/summary")
    @guarded
    def summary(request: Request, who: me, ref: str) -> Response:
        """The run's state and attempts alone: what the page swaps in when something moved."""
        with who.acting() as acting:
            run = acting.get_run(ref)
        return page("_run_summary.html", run=run)

    @router.get("/runs/{ref}/decision")
    @guarded
    def decision(request: Request, who: me, ref: str, replay: str | None = None) -> Response:
        with who.acting() as acting:
            run = acting.get_run(ref)
            try:
                found = acting.explain(run.id, replay=replay == "1")
            except NotFound:
                found = None
        values: dict[str, Any] = {"run": run, "found": found}
        if found is not None:
            values["decision"] = decision_view(found.decision)
            if found.replayed is not None:
                values["replayed"] = explain.one_line(found.replayed)
        return page("decision.html", **context(request, who, "queue", **values))

    @router.get("/queue")
    @guarded
    def queue(request: Request, who: me) -> Response:
        with who.acting() as acting:
            entries = who.seen(acting.queue(), lambda e: e.run)
        return page("queue.html", **context(request, who, "queue", entries=entries))

    return router


def _now() -> datetime:
    from datetime import UTC

    return datetime.now(UTC)


def _listing(service: CoreControlService, request: Request, who: Any) -> dict[str, Any]:
    """The runs the query asks for, a page of them, and the link to the next; a query value
    the page cannot use is said in one line, and the page shows without it."""
    q = request.query_params
    error = None
    try:
        state = choice(q.get("state"), "state", RunState)
        limit = whole(q.get("limit"), "limit", default=PAGE, high=500)
        before = _cursor(q.get("before"))
    except BadQuery as exc:
        error, state, limit, before = str(exc), None, PAGE, None
    filters = {k: q.get(k) or None for k in ("experiment", "user", "template", "q")}
    states = {RunState(state)} if state else ({*ACTIVE} if q.get("active") == "1" else None)
    with who.acting() as acting:
        try:
            found = acting.run_page(
                experiment=filters["experiment"],
                states=states,
                user=filters["user"],
                template=filters["template"],
                text=filters["q"],
                before=before,
                limit=limit,
                count_cap=COUNTED,
                viewer=who.viewer,
            )
        except NotFound as exc:  # an experiment that does not exist: no runs, and why
            error = str(exc)
            found = acting.run_page(limit=0, viewer=who.viewer)
        found = _with_progress(acting, found)
    next_link = None
    if len(found.runs) == limit and found.runs:
        last = found.runs[-1].run
        keep = {k: v for k, v in q.items() if k != "before" and v}
        keep["before"] = f"{last.created_at.isoformat()}|{last.id}"
        next_link = "/ui/runs?" + urlencode(keep)
    query = urlencode({k: v for k, v in q.items() if k != "before" and v})
    return {
        "page": found,
        "filters": filters,
        "state": state,
        "error": error,
        "next_link": next_link,
        "first_page": before is None,
        "query": query,
        "states": [s.value for s in RunState],
    }


# where a run's files are read on this machine (an agent pool's mirror, a local run): its
# progress costs a file read, so a listing shows it; elsewhere (SSH, Slurm) the run's page does
NEAR = ("agent_pool", "local")
PROGRESS_ROWS = 20  # the most rows of a page whose progress is read


def _with_progress(acting: Any, found: RunPage) -> RunPage:
    """The page, with the progress of each of its running runs whose files are near."""
    views, read = [], 0
    for view in found.runs:
        run = view.run
        near = run.current.backend_key.startswith(NEAR)
        if run.state is RunState.RUNNING and near and read < PROGRESS_ROWS:
            view = view.model_copy(update={"progress": acting.progress(run)})
            read += 1
        views.append(view)
    return found.model_copy(update={"runs": tuple(views)})


def _cursor(text: str | None) -> tuple[datetime, str] | None:
    if not text:
        return None
    at, _, run_id = text.partition("|")
    try:
        when = datetime.fromisoformat(at)
    except ValueError:
        when = None
    if when is None or when.tzinfo is None or not run_id:
        raise BadQuery("before must be a run's time and id as the next-page link gives them")
    return when, run_id


def decision_view(record: dict[str, Any]) -> dict[str, Any]:
    """A stored decision as the decision view lays it out: the line, each alternative's counts
    per reason and its nearest nodes (asked, used, capacity), and what was chosen."""
    total = record.get("nodes_total", 0)
    alternatives = []
    for n, alt in enumerate(record.get("alternatives", [])):
        verdicts = [
            {
                "node": v.get("node"),
                "reason": explain._WORDS.get(v.get("reason", ""), v.get("reason")),
                "figures": explain.figures(v),
                "asked": v.get("asked"),
                "used": v.get("used"),
                "capacity": v.get("capacity"),
            }
            for v in alt.get("nodes", ())
        ]
        alternatives.append(
            {
                "number": n + 1,
                "ask": alt.get("ask", ""),
                "line": explain.alternative_line(alt, total),
                "counts": sorted(alt.get("counts", {}).items(), key=lambda kv: -kv[1]),
                "nodes": verdicts,
            }
        )
    return {
        "line": explain.one_line(record),
        "outcome": record.get("outcome"),
        "tier": record.get("tier"),
        "position": record.get("position"),
        "waited_s": record.get("waited_s"),
        "alternatives": alternatives,
        "chosen": record.get("chosen"),
        "victims": record.get("victims", []),
        "scores": record.get("scores") or (record.get("chosen") or {}).get("scores"),
        "snapshot": record.get("snapshot"),
        "config": record.get("config"),
        "lines": explain.lines(record),
    }
