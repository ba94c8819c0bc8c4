"""One scheduling pass from end to end: the queue in order (tier, then fair share, then first
come), each run handed to fitting, then, for runs that fit nowhere, to preemption. Pure: a
snapshot, the queue and a config in, a plan out, the same plan every time (orbit explain
--replay relies on it). schedule() is the entry."""

from __future__ import annotations

import gc
import heapq
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from orbit.scheduler.fitting import place
from orbit.scheduler.model import Request, SchedConfig, Snapshot
from orbit.scheduler.pass_state import Pass
from orbit.scheduler.plan import Plan
from orbit.scheduler.preemption import preempt


def share(p: Pass, user: str) -> float:
    """The user's dominant share (DRF): the larger of their share of GPUs and of CPUs,
    over their quota's weight."""
    quota = p.config.quota("user", user)
    weight = quota.weight if quota is not None and quota.weight > 0 else 1.0
    gpus = p.gpus_of["user", user] / p.total_gpus
    cpus = p.cpus_of[user] / p.total_cpus
    return round(max(gpus, cpus) / weight, 9)


def run_queue(p: Pass, queue: list[Request]) -> Plan:
    plan = Plan()
    tiers: dict[int, dict[str, list[Request]]] = defaultdict(lambda: defaultdict(list))
    for req in sorted(queue, key=lambda r: (r.submitted_at, r.run_id)):
        tiers[req.tier][req.user].append(req)
    waiting: list[Request] = []
    for tier in sorted(tiers):
        users = tiers[tier]
        heads = {user: 0 for user in users}
        heap = [(share(p, u), q[0].submitted_at, q[0].run_id, u) for u, q in users.items()]
        heapq.heapify(heap)
        while heap:
            _, _, _, user = heapq.heappop(heap)
            req = users[user][heads[user]]
            heads[user] += 1
            plan.order.append(req.run_id)
            if not place(p, req, plan, len(plan.order)):
                waiting.append(req)
            if heads[user] < len(users[user]):
                nxt = users[user][heads[user]]
                heapq.heappush(heap, (share(p, user), nxt.submitted_at, nxt.run_id, user))
    if p.config.preemption:
        preempt(p, waiting, plan)
    return plan


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector held off for a pass and the making of its records:
    a pass makes a few hundred thousand objects and frees most of them by reference count,
    yet each full collection walks every one (0.1-0.25 s, three or so a pass at 10,000 runs).
    Whatever cycles it leaves are collected once it is over. For the caller that runs passes
    (the server's scheduler, the bench); schedule() itself leaves the process's settings be."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def schedule(
    snapshot: Snapshot,
    queue: list[Request],
    config: SchedConfig,
    filters: dict[str, Any] | None = None,
    scorers: dict[str, Any] | None = None,
) -> Plan:
    """The plan for `queue` on `snapshot` under `config`. Pure and deterministic."""
    return run_queue(Pass(snapshot, config, filters, scorers), queue)
