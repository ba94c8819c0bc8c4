"""Why a run waits, for its record: per alternative, the count of nodes per reason and the few
nearest to fitting in full, kept current as the pass changes nodes; when it could start (as
Slurm's backfill guesses); and the node a run that has waited long enough holds."""

from __future__ import annotations

from collections import Counter
from typing import Any

from orbit.scheduler.filters import busy_reason, check_free, check_selector, check_target
from orbit.scheduler.model import Ask, Request
from orbit.scheduler.pass_state import AskView, Pass, Shape
from orbit.scheduler.reasons import BUSY, Reason, Verdict

FITS = "fits"  # a node's reason where it has none: it can take the ask now
BUSY_REASONS = frozenset(r.value for r in Reason if r.kind == BUSY)  # "busy"-kind reasons


def why(p: Pass, shape: Shape, ask: Ask, req: Request) -> dict[str, Any]:
    """Counts per reason over every node for one alternative, and the nodes nearest to
    fitting in full. A node's reason is made again only where the node changed since it
    was made (and once for all shapes of the ask); the record is made again only where
    one did; the figures are made only for the nodes the record describes in full."""
    epoch = len(p.changes)
    now = _reasons(p, shape.view, ask)
    if shape.wait is None:
        shape.wait = {i: now[i] for i in shape.candidates}
        shape.counts = Counter(shape.wait.values())
    elif shape.wait_epoch != epoch:
        wait, counts = shape.wait, shape.counts
        changed = p.changed_since(shape.wait_epoch, shape.candidates, shape.member)
        for i in changed:
            counts[wait[i]] -= 1
            wait[i] = reason = now[i]
            counts[reason] += 1
        if not changed:
            # none of its nodes changed (others did): the record it has is still right,
            # as all in it comes from its own nodes
            shape.wait_epoch = epoch
    if shape.record is not None and shape.wait_epoch == epoch:
        return dict(shape.record)
    shape.wait_epoch = epoch
    counts = Counter(_never(p, shape, ask, req))
    counts.update({r: n for r, n in shape.counts.items() if r != FITS and n > 0})
    top: list[Verdict] = []
    for i in shape.candidates:
        if len(top) >= p.config.top_nodes:
            break
        if shape.wait[i] != FITS:
            verdict = _busy(p, shape.view, ask, i)  # as `wait` saw it: the same verdict
            if verdict is not None:
                top.append(verdict)
    top += shape.samples[: p.config.top_nodes - len(top)]
    out: dict[str, Any] = {
        "ask": shape.view.text,
        "counts": dict(sorted(counts.items())),
        "nodes": [v.record() for v in top],
    }
    if shape.counts.get(FITS, 0) > 0:
        out["fits"] = shape.counts[FITS]  # fewer than a gang needs
    shape.record = out
    return dict(out)


def _reasons(p: Pass, view: AskView, ask: Ask) -> dict[int, str]:
    """Why each node that could ever serve the ask cannot take it now (FITS: it can), for
    anyone (a hold for a run counts against every run here). Made once per ask, not per
    shape, and made again only for the nodes changed since."""
    epoch = len(p.changes)
    if view.reasons is not None and view.epoch == epoch:
        return view.reasons
    if view.reasons is None:
        todo: list[int] | set[int] = view.fits
        view.reasons = {}
    else:
        todo = p.changed_since(view.epoch, view.fits, view.reasons)
    reasons, per_sig, sig_of, nodes, uses = (
        view.reasons,
        view.per_sig,
        p.sig_of,
        p.nodes,
        p.uses,
    )
    for i in todo:
        reasons[i] = busy_reason(ask, _NOBODY, nodes[i], uses[i], per_sig[sig_of[i]][1]) or FITS
    view.epoch = epoch
    return reasons


def _busy(p: Pass, view: AskView, ask: Ask, i: int) -> Verdict | None:
    """_reasons' verdict in full, with its figures: for the few nodes a record describes.
    Those are much the same nodes from one waiting run to the next: a verdict is kept
    per ask until its node changes."""
    at = p.changed_at[i]
    kept = view.verdicts.get(i)
    if kept is None or kept[0] != at:
        usable = view.per_sig[p.sig_of[i]][1]
        verdict = check_free(ask, _NOBODY, p.nodes[i], p.uses[i], usable)[0]
        kept = view.verdicts[i] = (at, verdict)
    return kept[1]


def estimate(p: Pass, req: Request) -> float | None:
    """When the run could start, as Slurm's backfill guesses it: the soonest that every
    attempt on a node that is only busy for it has to end by (its max_runtime), as the
    snapshot has them; None where some attempt there has no limit, or no node is merely
    busy. Made once per shape and pass."""
    best: float | None = None
    for ask in req.alternatives:
        shape = p.shape(ask, req)
        if shape.wait is None:
            continue
        if shape.estimate is None:
            shape.estimate = (0, _soonest(p, shape))
        at = shape.estimate[1]
        if at is not None:
            best = at if best is None else min(best, at)
    return None if best is None else round(max(best, p.at), 1)


def _soonest(p: Pass, shape: Shape) -> float | None:
    found = [
        end
        for i, reason in (shape.wait or {}).items()
        if reason in BUSY_REASONS and (end := p.ends[i]) is not None
    ]
    return min(found) if found else None


def reserve(p: Pass, req: Request) -> str | None:
    """A run that has waited past reserve_after_s holds the node nearest to fitting it
    (busy only, not reserved already): nothing behind it takes room there meanwhile."""
    if p.at - req.submitted_at < p.config.reserve_after_s:
        return None
    ask = req.alternatives[0]
    shape = p.shape(ask, req)
    now = _reasons(p, shape.view, ask)
    for i in shape.candidates:
        use = p.uses[i]
        if use.reserved_for is not None:
            continue
        if now[i] in BUSY_REASONS:
            use.reserved_for = req.run_id
            p.held.add(i)
            p.changed(i)
            return p.nodes[i].name
    return None


def _never(p: Pass, shape: Shape, ask: Ask, req: Request) -> Counter[str]:
    """Why each node that could never serve the shape cannot, counted (per signature, not
    per node), and the first few in full: made once, when a run of the shape first waits."""
    if shape.static is not None:
        return shape.static
    if p.filters:
        return _never_one_by_one(p, shape, ask, req)
    per_sig = p.ask_view(ask).per_sig
    static: Counter[str] = Counter()
    chosen = p.selected(req.selector) if req.selector else None
    if req.target:
        hits = sorted(p.targeted(req.target))
        static[Reason.TARGET.value] = len(p.nodes) - len(hits)
        inside: Counter[int] = Counter(p.sig_of[i] for i in hits if chosen is None or i in chosen)
        if chosen is not None:
            static[Reason.SELECTOR.value] += sum(1 for i in hits if i not in chosen)
    elif chosen is not None:
        static[Reason.SELECTOR.value] = len(p.nodes) - len(chosen)
        inside = p.sig_histogram(req.selector)
    else:
        inside = p.sig_sizes
    for sig, n in inside.items():
        reason = per_sig[sig][0]
        if reason is not None and n:
            static[reason] += n
    static = Counter({r: n for r, n in static.items() if n > 0})
    for i, node in enumerate(p.nodes):  # the first few, in full: their own figures
        if len(shape.samples) >= p.config.top_nodes:
            break
        if i in shape.member:
            continue
        verdict = check_target(req, node)
        if verdict is None and chosen is not None and i not in chosen:
            verdict = check_selector(req, node)
        verdict = verdict or p.static(ask, node)[0]
        if verdict is not None:
            shape.samples.append(verdict)
    shape.static = static
    return static


def _never_one_by_one(p: Pass, shape: Shape, ask: Ask, req: Request) -> Counter[str]:
    """_never where a site's filters run: they look at each node."""
    static: Counter[str] = Counter()
    for i, node in enumerate(p.nodes):
        if i in shape.member:
            continue
        verdict = check_target(req, node) or check_selector(req, node)
        verdict = verdict or p.static(ask, node)[0]
        verdict = verdict or p.plugin_filters(ask, req, node)
        if verdict is None:
            continue
        static[verdict.reason.value] += 1
        if len(shape.samples) < p.config.top_nodes:
            shape.samples.append(verdict)
    shape.static = static
    return static


_NOBODY = Request(run_id="", attempt_id="", alternatives=(), submitted_at=0.0)
