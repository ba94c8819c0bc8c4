"""The check made at submit against the registered nodes: a request no node could ever serve
(whatever runs there, whether it is online now) is refused, in words that name what it asked
for and what the nodes have."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from orbit.model.models import ExecutionRequest
from orbit.model.nodes import SERVICE_LABEL, NodeRecord
from orbit.scheduler.model import NodeView, Request, SchedConfig, Snapshot
from orbit.scheduler.node_views import node_view
from orbit.scheduler.pass_state import Pass
from orbit.scheduler.request_views import asks_of, selector_of


def never_fits(
    request: ExecutionRequest,
    nodes: list[NodeRecord],
    at: datetime,
    config: SchedConfig,
    service_field: str = "task.service",
) -> str | None:
    """Why no registered node could ever hold any of the request's alternatives, whatever
    runs there, whether it is online now and whether its GPUs are healthy now (a GPU is reset,
    a node comes back); None if one could."""

    def ever(view: NodeView) -> NodeView:
        gpus = tuple(replace(g, healthy=True, problem="") for g in view.gpus)
        return replace(view, state="active", offline_s=None, max_tasks=1, gpus=gpus)

    views = tuple(ever(node_view(n, at, ())) for n in nodes)
    probe = Request(
        run_id="",
        attempt_id="",
        alternatives=asks_of(request.resources),
        submitted_at=0.0,
        selector=tuple(sorted(selector_of(request).items())),
        target=request.target if request.target not in (None, "", "pool") else None,
    )
    checker = Pass(Snapshot("submit", at.timestamp(), views), config)
    most = max(len(checker.shape(ask, probe).candidates) for ask in probe.alternatives)
    if most >= request.num_nodes:
        return None
    if most:  # some node could, but fewer than the gang needs
        return (
            f"num_nodes: {request.num_nodes} nodes asked for at once, but only {most} "
            f"registered node(s) could ever hold {'; '.join(a.text() for a in probe.alternatives)}"
        )
    largest = max(views, key=lambda v: (len(v.gpus), v.cpus, v.memory_gb, v.name))
    field = "resources.any_of" if len(probe.alternatives) > 1 else "resources"
    asked = "; ".join(a.text() for a in probe.alternatives)
    if probe.target:
        pinned = [v for v in views if probe.target in (v.name, v.id)]
        if not pinned:
            return unknown_node(probe.target, [v.name for v in views])
        lacks = sorted(set(probe.selector) - set(pinned[0].labels))
        if lacks:
            wanted = ", ".join(f"{k}={v}" for k, v in lacks)
            return f"target: node {pinned[0].name} does not have the labels {wanted}"
        return f"target: node {pinned[0].name} could never hold {asked}; it has {_has(pinned[0])}"
    if probe.selector and not any(
        checker.shape(ask, replace(probe, selector=())).candidates for ask in probe.alternatives
    ):
        pass
    elif probe.selector:
        return _no_node_has(probe.selector, views, service_field)
    return (
        f"{field}: no registered node could ever hold {asked}; the largest, {largest.name}, has "
        f"{_has(largest)}"
    )


def _no_node_has(
    selector: tuple[tuple[str, str], ...], views: tuple[NodeView, ...], service_field: str
) -> str:
    """The refusal of a request whose labels no node has together: a model server no node
    advertises is named as such, by the task's field that asked for it."""
    has = {pair for v in views for pair in v.labels}
    missing = [(k, v) for k, v in selector if (k, v) not in has]
    services = [k.removeprefix(SERVICE_LABEL) for k, _ in missing if k.startswith(SERVICE_LABEL)]
    if services and len(services) == len(missing):
        names = ", ".join(services)
        return (
            f"{service_field}: no registered node advertises {names} (a node does with "
            f"`orbit agent --service {services[0]}=URL`)"
        )
    wanted = ", ".join(f"{k}={v}" for k, v in (missing or selector))
    together = "" if missing else " together"
    return f"selector: no registered node has the labels {wanted}{together}"


def _has(view: NodeView) -> str:
    models = sorted({g.model for g in view.gpus})
    gpus = f"{len(view.gpus)} GPU(s)" + (f" ({', '.join(models)})" if models else "")
    return f"{gpus}, {view.cpus:g} CPUs, {view.memory_gb:g} GB RAM"


def unknown_node(name: str, known: list[str]) -> str:
    """`target: no node is named 'gpu-z'; did you mean gpu-a? (nodes: gpu-a, gpu-b)`"""
    from orbit.model.keys import nearest

    near = nearest(name, known)
    shown = sorted(known)
    listed = ", ".join(shown[:20]) + (f" and {len(shown) - 20} more" if len(shown) > 20 else "")
    meant = f"; did you mean {near}?" if near else ""
    return f"target: no node is named '{name}'{meant} (nodes: {listed})"
