"""Making room: for runs that fit nowhere, the fewest and cheapest preemptible attempts of
lower tiers to push off one node, with a cooldown per node and a cap per pass (no churn)."""

from __future__ import annotations

from orbit.scheduler.filters import Use, check_free
from orbit.scheduler.model import Ask, NodeView, Request, Running
from orbit.scheduler.pass_state import Pass
from orbit.scheduler.plan import Plan, Preemption, victim_record


def preempt(p: Pass, waiting: list[Request], plan: Plan) -> None:
    """For each run that waits, most urgent first: the node where stopping the fewest,
    cheapest preemptible attempts of lower tiers makes it fit. A node that had work pushed
    off within preempt_cooldown_s is left alone, and a pass pushes off at most
    max_preemptions_per_pass nodes' worth: no churn."""
    made = 0
    for req in waiting:
        record = plan.decisions[req.run_id]
        if req.run_id in p.stopping_for:
            i, victims = p.stopping_for[req.run_id]
            record["outcome"] = "preempting"
            record["reserved"] = p.nodes[i].name
            record["victims"] = [victim_record(v, p.nodes[i].name, p.config) for v in victims]
            continue
        if made >= p.config.max_preemptions_per_pass:
            continue
        if any("quota" in t for t in record["alternatives"]):
            continue
        best = _cheapest(p, req)
        if best is None:
            continue
        i, victims = best
        node = p.nodes[i]
        p.uses[i].reserved_for = req.run_id
        p.held.add(i)
        p.taken_victims.update(v.attempt_id for v in victims)
        plan.preemptions.append(Preemption(req.run_id, node.id, node.name, tuple(victims)))
        record["outcome"] = "preempting"
        record["reserved"] = node.name
        record["victims"] = [victim_record(v, node.name, p.config) for v in victims]
        made += 1


def _cheapest(p: Pass, req: Request) -> tuple[int, list[Running]] | None:
    best: tuple[tuple[float, ...], int, list[Running]] | None = None
    for ask in req.alternatives:
        if req.num_nodes != 1:
            break  # a gang waits for its nodes: pushing work off several at once is not
        shape = p.shape(ask, req)
        for i in shape.candidates:
            node = p.nodes[i]
            if node.preempted_at is not None and (
                p.at - node.preempted_at < p.config.preempt_cooldown_s
            ):
                continue
            use = p.uses[i]
            if use.reserved_for not in (None, req.run_id):
                continue
            pool = sorted(
                (
                    r
                    for r in node.running
                    if r.preemptible and r.tier > req.tier and r.attempt_id not in p.taken_victims
                ),
                key=lambda r: (-r.tier, -r.started_at, r.attempt_id),
            )
            victims = _fewest(ask, req, node, use, p.usable(ask, i), pool)
            if victims is None:
                continue
            cost = (
                float(len(victims)),
                float(sum(len(v.gpus) for v in victims)),
                float(-min(v.tier for v in victims)),
            )
            if best is None or cost < best[0]:
                best = (cost, i, victims)
        if best is not None:
            return best[1], best[2]
    return None


def _fewest(
    ask: Ask, req: Request, node: NodeView, use: Use, usable: tuple[int, ...], pool: list[Running]
) -> list[Running] | None:
    """The shortest prefix of `pool` (cheapest first) whose stopping makes the ask fit."""
    if not pool:
        return None
    trial = Use(node)
    trial.reserved_for = None
    trial.tasks, trial.cpus, trial.memory_gb = use.tasks, use.cpus, use.memory_gb
    trial.gpus, trial.taken = dict(use.gpus), use.taken
    for n, victim in enumerate(pool, start=1):
        trial.tasks -= 1
        trial.cpus -= victim.cpus
        trial.memory_gb -= victim.memory_gb
        for g in victim.gpus:
            used = trial.gpus.get(g)
            if not victim.gpu_share_gb or used is None:
                trial.set_gpu(g, None)
            else:
                left = used - victim.gpu_share_gb
                trial.set_gpu(g, left if left > 1e-9 else None)
        if check_free(ask, req, node, trial, usable)[0] is None:
            return pool[:n]
    return None
