"""The console's views of what a run leaves: its sealed artifacts (path, size, sha256, each a
download), the previews it writes as they arrive (text shown as text, images as images, nothing
else rendered), a log's older lines on demand, and the diff with another run."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response

from orbit.core.control.service import CoreControlService
from orbit.model.errors import NotFound
from orbit.server.routes.common import me
from orbit.server.ui.common import FILE_HEADERS, attachment, console_router, context, guarded, whole
from orbit.server.ui.live import layer_named
from orbit.server.ui.render import page

IMAGES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
          ".webp": "image/webp"}  # fmt: skip
TEXTS = (".txt", ".md", ".log", ".json", ".jsonl", ".csv", ".yaml", ".yml")


def make_file_pages(service: CoreControlService) -> APIRouter:
    router = console_router()

    @router.get("/runs/{ref}/artifacts")
    @guarded
    def artifacts(request: Request, who: me, ref: str) -> Response:
        with who.acting() as acting:
            run = acting.get_run(ref)
            entries = acting.artifacts(run.id)
        return page("_artifacts.html", run=run, entries=entries)

    @router.get("/runs/{ref}/artifacts/{path:path}")
    @guarded
    def artifact(request: Request, who: me, ref: str, path: str) -> Response:
        with who.acting() as acting:
            data = acting.artifact(ref, path)
        headers = {**FILE_HEADERS, "Content-Disposition": attachment(path.rsplit("/", 1)[-1])}
        return Response(data, media_type="application/octet-stream", headers=headers)

    @router.get("/runs/{ref}/previews")
    @guarded
    def previews(request: Request, who: me, ref: str) -> Response:
        with who.acting() as acting:
            run = acting.get_run(ref)
            found = acting.previews(run.id)
        shown = []
        for name, data in found.items():
            kind = _kind(name)
            text = data.decode("utf-8", "replace") if kind == "text" else None
            shown.append({"name": name, "kind": kind, "text": text})
        return page("_previews.html", run=run, previews=shown, live=not run.state.terminal)

    @router.get("/runs/{ref}/previews/{name}")
    @guarded
    def preview(request: Request, who: me, ref: str, name: str) -> Response:
        kind = IMAGES.get(_suffix(name))
        if kind is None:
            raise NotFound(f"run {ref} has no image preview '{name}' (png, jpeg, gif or webp)")
        with who.acting() as acting:
            data = acting.preview(ref, name)
        return Response(data, media_type=kind, headers=FILE_HEADERS)

    @router.get("/runs/{ref}/logs/{layer}/older")
    @guarded
    def older(request: Request, who: me, ref: str, layer: str) -> Response:
        offset = whole(request.query_params.get("offset"), "offset", default=0, low=0,
                       high=2**62)  # fmt: skip
        attempt = request.query_params.get("attempt")
        number = whole(attempt, "attempt", default=0, high=10**6) or None
        with who.acting() as acting:
            data, start = acting.log_before(ref, layer_named(layer), offset, number)
        return JSONResponse({"text": data.decode("utf-8", "replace"), "offset": start})

    @router.get("/runs/{ref}/diff")
    @guarded
    def diff(request: Request, who: me, ref: str) -> Response:
        other = request.query_params.get("other", "").strip()
        with who.acting() as acting:
            run = acting.get_run(ref)
            if other:
                who.see_run(other)
            found = acting.diff_runs(run.id, other) if other else None
        values = context(request, who, "runs", run=run, other=other, diff=found)
        return page("diff.html", **values)

    return router


def _suffix(name: str) -> str:
    return "." + name.rsplit(".", 1)[-1].lower() if "." in name else ""


def _kind(name: str) -> str:
    suffix = _suffix(name)
    if suffix in IMAGES:
        return "image"
    return "text" if suffix in TEXTS or not suffix else "other"
