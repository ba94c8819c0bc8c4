"""Names for the shell's completion, from where the CLI's commands would read them: a server
(one request with the caller's token, so a user is offered only what they may see) or the
embedded store (orbit.core.control.names); and the templates' ids, the server's or the files
here. Light on purpose: each answer imports no more than it reads with."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orbit.model.config import Settings

SHOWN = 50  # the most run ids a server is asked for (the newest)
WAIT_S = 2.0  # a server that has not answered by then offers nothing

REMOTE: dict[str, tuple[str, Callable[[Any], list[str]]]] = {
    "runs": (f"/runs?limit={SHOWN}", lambda data: [view["run"]["id"] for view in data["runs"]]),
    "groups": (f"/groups?limit={SHOWN}", lambda data: [g["id"] for g in data["groups"]]),
    "experiments": ("/experiments", lambda data: [e["name"] for e in data]),
    "nodes": ("/nodes", lambda data: [n["name"] for n in data]),
    "templates": ("/templates", lambda data: [t["template"]["id"] for t in data]),
}


def names(settings: Settings, what: str) -> list[str]:
    """`what` (runs, groups, experiments, nodes or templates) by name, as the settings'
    control plane has them; raises what reading them raised (the caller offers nothing)."""
    if settings.server:
        import httpx

        path, read = REMOTE[what]
        headers = {"Authorization": f"Bearer {settings.token}"} if settings.token else {}
        answer = httpx.get(f"{settings.server}/api/v1{path}", headers=headers, timeout=WAIT_S)
        return read(answer.json()) if answer.status_code == 200 else []
    if what == "templates":
        from orbit.model.templates import TemplateRegistry, default_search_path

        return TemplateRegistry(default_search_path(settings.templates_dir, Path.cwd())).ids()
    from orbit.core.control.names import stored_names

    return stored_names(settings.database_url, what)
