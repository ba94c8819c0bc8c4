"""The scorers of a placement: each ranks a node that will do, 0 (worst) .. 1 (best); the
pass sums them by the config's weights."""

from __future__ import annotations

from collections.abc import Callable

from orbit.scheduler.filters import Use
from orbit.scheduler.model import Ask, NodeView, Request


def score_binpack(ask: Ask, req: Request, node: NodeView, use: Use) -> float:
    """How full the node is once the ask is placed there, by what the ask uses most of (at
    most 1: `x if x < 1.0 else 1.0` is min(1.0, x), without the call, as every node a
    placement scores is scored here)."""
    if ask.gpu.count and node.gpus:
        full = (use.taken + ask.gpu.count) / len(node.gpus)
    elif node.cpus and ask.cpus:
        full = (use.cpus + ask.cpus) / node.cpus
    else:
        full = (use.tasks + 1) / max(node.max_tasks, 1)
    return full if full < 1.0 else 1.0


def score_spread(ask: Ask, req: Request, node: NodeView, use: Use) -> float:
    return 1.0 - score_binpack(ask, req, node, use)


def score_cached(ask: Ask, req: Request, node: NodeView, use: Use) -> float:
    return 0.0 if node.cached.isdisjoint(req.cache_keys) else 1.0


Scorer = Callable[[Ask, Request, NodeView, Use], float]

SCORERS: dict[str, Scorer] = {
    "binpack": score_binpack,
    "spread": score_spread,
    "cached": score_cached,
}
