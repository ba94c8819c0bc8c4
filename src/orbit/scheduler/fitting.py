"""Placing one run in a pass: each of its alternatives in turn, within quota, on the best nodes
that fit it (the first few of those that could, scored), else the record of why it waits.

A run that cannot fit never holds back the runs behind it (no head-of-line blocking); a run
that has waited past `reserve_after_s` reserves the node it needs (orbit.scheduler.waiting),
so that a stream of smaller runs cannot starve it either. A gang (num_nodes > 1) is placed on
its `num_nodes` best nodes at once, or waits."""

from __future__ import annotations

from itertools import islice, takewhile
from typing import Any

from orbit.scheduler.filters import fits_now
from orbit.scheduler.model import Ask, Request
from orbit.scheduler.pass_state import Pass, Shape
from orbit.scheduler.plan import Placement, Plan, decision_record
from orbit.scheduler.waiting import estimate, reserve, why


def _quota(p: Pass, req: Request, ask: Ask) -> dict[str, Any] | None:
    need = ask.gpu.count * req.num_nodes
    if not need:
        return None
    for scope, name in (("user", req.user), ("experiment", req.experiment)):
        quota = p.config.quota(scope, name)
        if quota is not None and p.gpus_of[scope, name] + need > quota.gpus:
            return {
                "scope": scope,
                "name": name,
                "asked": need,
                "used": p.gpus_of[scope, name],
                "limit": quota.gpus,
            }
    return None


def place(p: Pass, req: Request, plan: Plan, position: int) -> bool:
    tried: list[dict[str, Any]] = []
    for n, ask in enumerate(req.alternatives):
        over = _quota(p, req, ask)
        if over is not None:
            tried.append({"ask": ask.text(), "quota": over})
            continue
        shape = p.shape(ask, req)
        found, considered = _find(p, shape, ask, req, req.num_nodes)
        if found is not None:
            nodes = []
            for i, gpus in found:
                p.take(i, ask, req, gpus)
                nodes.append((p.nodes[i].id, p.nodes[i].name, gpus))
            placement = Placement(req.run_id, req.attempt_id, n, tuple(nodes), ask)
            plan.placements.append(placement)
            chosen = {
                "alternative": n,
                "ask": shape.view.text,
                "considered": considered,
                "nodes": [{"node": name, "gpus": list(g)} for _, name, g in nodes],
            }
            plan.decisions[req.run_id] = decision_record(
                p, req, position, "placed", tried, chosen=chosen
            )
            return True
        tried.append(why(p, shape, ask, req))
    reserved = reserve(p, req) if not any("quota" in t for t in tried) else None
    record = decision_record(p, req, position, "waiting", tried, reserved=reserved)
    record["estimated_start"] = estimate(p, req)
    plan.decisions[req.run_id] = record
    return False


def _find(
    p: Pass, shape: Shape, ask: Ask, req: Request, count: int
) -> tuple[list[tuple[int, tuple[int, ...]]] | None, int]:
    """The `count` best nodes for the ask (with the GPUs each gives), or None; and how
    many nodes were looked at."""
    want = max(p.config.score_nodes, count)
    window: list[tuple[int, tuple[int, ...]]] = []
    looked = 0
    view = shape.view
    usable, full, room = view.per_sig, view.full, view.room
    sig_of, nodes, uses, dead = p.sig_of, p.nodes, p.uses, shape.dead
    changed_at = p.changed_at
    run_id = req.run_id
    live = shape.live
    # most looks start with nodes that other shapes of the ask found full since this one
    # last looked (the fullest come first under binpack, and fill first): where none of
    # them is held for a run, they are counted as looked at and leave the list in one go,
    # as the loop below would one by one
    ahead = len(list(takewhile(full.__contains__, live))) if want else 0
    if ahead and p.held.isdisjoint(islice(live, ahead)):
        looked = ahead
        dead.update(islice(live, ahead))
        del live[:ahead]
    whole = 0 if ask.gpu_share_gb else ask.gpu.count  # whole GPUs it asks for
    kept: list[int] = []  # the nodes the loop looked at that stay in `live`, in its order
    n = 0  # how many it looked at
    for i in live:
        if len(window) >= want:
            break
        n += 1
        use = uses[i]
        held = use.reserved_for
        if i in full or (held is not None and held != run_id) or use.size - use.taken < whole:
            # found full for the ask (by any shape of it), held for another run, or fewer
            # GPUs free than it asks for: no room, the answer fits_now would give,
            # without calling it
            gpus = None
        elif (had := room.get(i)) is not None and had[0] == changed_at[i]:
            gpus = had[1]  # it fit and has not changed since (not held for another run)
        else:
            gpus = fits_now(ask, req, nodes[i], use, usable[sig_of[i]][1])
            if gpus is not None:
                room[i] = (changed_at[i], gpus)
        if gpus is not None:
            window.append((i, gpus))
            kept.append(i)
        elif held is None or use.tasks >= nodes[i].max_tasks:
            # not held for a run (that is not for every run): full, and nothing frees up
            # within a pass, so full for good, for every shape of the ask; why is made if
            # a run of it waits. Held for a run, it is looked at again (and counted) on
            # each look, as it always was
            full.add(i)
            dead.add(i)
        else:
            kept.append(i)
    looked += n
    if len(kept) < n:
        live[:n] = kept  # what this look found full leaves the list
    if p.weights.get("cached") and req.cache_keys:
        seen = {i for i, _ in window}
        for key in req.cache_keys:
            for i in p.cache_index.get(key, ()):
                if i in seen or i not in shape.member or i in dead:
                    continue
                looked += 1
                if i in full:
                    continue
                gpus = fits_now(ask, req, nodes[i], uses[i], usable[sig_of[i]][1])
                if gpus is not None:
                    window.append((i, gpus))
                    seen.add(i)
    if len(window) < count:
        return None, looked
    # the best scores first; among equal scores, the window's order (r: its place there)
    scoring, best = p.scoring, []
    for r, (i, _) in enumerate(window):
        node, use = nodes[i], uses[i]
        # sum() of the weighted scores in the weights' order: the same float every time
        total = sum([w * scorer(ask, req, node, use) for scorer, w in scoring])
        best.append((-round(float(total), 9), r))
    best.sort()
    return [window[r] for _, r in best[:count]], looked
