"""One scheduling pass: the queue in order (tier, then fair share, then first come), each run
placed on the best node that fits its first alternative that fits anywhere, or told why it
waits; then, for runs that fit nowhere, the fewest and cheapest lower-tier preemptible
attempts to push off. Pure: a snapshot, the queue and a config in, a plan out, the same plan
every time (orbit explain --replay relies on it).

A run that cannot fit never holds back the runs behind it (no head-of-line blocking); a run
that has waited past `reserve_after_s` reserves the node it needs, so that a stream of smaller
runs cannot starve it either.

Cost: each distinct ask (its alternative, selector and target) is filtered against every node
once per pass; after that a placement looks at the first few nodes of a list from which those
found full for that ask are dropped (usage only grows within a pass), and scores
`score_nodes` feasible ones, as the Kubernetes scheduler and Nomad do rather than scoring
every node. What depends on the ask alone (which nodes could serve it, which are full for it,
what room each has, why each cannot take it now) is worked out once per ask and shared by its
shapes: a queue has many selectors over few asks; and kept until the node it is about
changes: a placement changes one node or a few."""

from __future__ import annotations

import gc
import heapq
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import compress, islice, takewhile
from typing import Any

from orbit.scheduler.checks import (
    BUSY,
    SCORERS,
    Reason,
    Use,
    Verdict,
    busy_reason,
    check_free,
    check_gpus,
    check_health,
    check_selector,
    check_target,
    check_totals,
    fits_now,
    node_condition,
)
from orbit.scheduler.model import Ask, NodeView, Request, Running, SchedConfig, Snapshot

FITS = "fits"  # a node's reason where it has none: it can take the ask now
BUSY_REASONS = frozenset(r.value for r in Reason if r.kind == BUSY)  # "busy"-kind reasons


@dataclass(frozen=True)
class Placement:
    run_id: str
    attempt_id: str
    alternative: int
    nodes: tuple[tuple[str, str, tuple[int, ...]], ...]  # (node id, name, GPU indices) by rank
    ask: Ask


@dataclass(frozen=True)
class Preemption:
    run_id: str  # the run the room is made for
    node_id: str
    node: str
    victims: tuple[Running, ...]


@dataclass
class Plan:
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)  # run id -> record
    placements: list[Placement] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # run ids as the pass took them


class _AskView:
    """What one ask (an alternative, whoever asks) makes of the nodes for the pass, shared by
    every shape of it: per signature why its nodes can never serve it (or the GPUs they could
    give); the nodes that could, best first; those found full for it for good (full for any
    run: usage only grows in a pass, and a hold for a run only adds a reason); and, once a
    run of it waits, why each of those nodes cannot take it now, as of `epoch`. What it keeps
    of one node (its room, its verdict) is marked with the node's changed_at, and made again
    once the node has changed since."""

    __slots__ = ("epoch", "fits", "full", "per_sig", "reasons", "room", "text", "verdicts")

    def __init__(
        self, ask: Ask, per_sig: list[tuple[str | None, tuple[int, ...]]], fits: list[int]
    ) -> None:
        self.text = ask.text()  # as records write it
        self.per_sig = per_sig
        self.fits = fits
        self.full: set[int] = set()
        # node -> (its changed_at, the GPUs it gives the ask then), for nodes found to fit:
        # each look goes over much the same first few nodes, and a placement changes only
        # the one (or the few) it takes. True for any run the node is not held for
        self.room: dict[int, tuple[int, tuple[int, ...]]] = {}
        self.reasons: dict[int, str] | None = None  # node of `fits` -> its reason, or FITS
        self.epoch = -1
        # node -> (its changed_at, check_free's verdict then): see Pass._busy
        self.verdicts: dict[int, tuple[int, Verdict | None]] = {}


class _Shape:
    """One ask's view of the nodes for the pass (its alternative, selector and target): the
    nodes that could ever serve it, best first; those this shape found full (usage only grows
    in a pass, so they stay full); and, once a run of it waits, every node's reason, kept
    current where a node changed since."""

    __slots__ = (
        "candidates",
        "counts",
        "dead",
        "estimate",
        "live",
        "member",
        "record",
        "samples",
        "static",
        "view",
        "wait",
        "wait_epoch",
    )

    def __init__(self, view: _AskView, candidates: list[int]) -> None:
        self.view = view  # its ask's, kept here: an Ask is hashed field by field to look up
        self.candidates = candidates  # every node that could ever serve it, best first
        # those this shape has not found full yet: a look takes a node found full out of it,
        # so no later look walks past it again (the fullest nodes come first under binpack,
        # and fill first)
        self.live = list(candidates)
        self.member = set(candidates)
        # found full by this shape: not looked at again, nor counted as looked at
        # (`considered` in a decision counts the others, so this stays per shape, not per ask)
        self.dead: set[int] = set()
        self.static: Counter[str] | None = None  # the other nodes' reasons, made when asked
        self.samples: list[Verdict] = []
        self.wait: dict[int, str] | None = None  # node -> its reason (FITS) at wait_epoch
        self.counts: Counter[str] = Counter()  # of `wait`'s reasons
        self.wait_epoch = -1
        self.record: dict[str, Any] | None = None  # the alternative's record at wait_epoch
        self.estimate: tuple[int, float | None] | None = None


class Pass:
    def __init__(
        self,
        snapshot: Snapshot,
        config: SchedConfig,
        filters: dict[str, Any] | None = None,
        scorers: dict[str, Any] | None = None,
    ) -> None:
        self.at = snapshot.at
        self.snapshot = snapshot
        self.config = config
        self.nodes = snapshot.nodes
        self.uses = [Use(n) for n in self.nodes]
        self.changes: list[int] = []  # node indices, one per change of what they have free
        self.shapes: dict[tuple[Any, ...], _Shape] = {}
        self.filters = filters or {}
        self.scorers = {**SCORERS, **(scorers or {})}
        self.weights = {
            name: w
            for name, w in config.weights.items()
            if w and (name not in ("binpack", "spread") or name == config.scorer)
        }
        # the scorers to call, in the weights' order (the sum's order: the same float bits)
        self.scoring = [(self.scorers[name], w) for name, w in self.weights.items()]
        self.cache_index: dict[str, list[int]] = defaultdict(list)
        self.gpus_of: Counter[tuple[str, str]] = Counter()  # (scope, name) -> GPUs held
        self.cpus_of: defaultdict[str, float] = defaultdict(float)
        self.total_gpus = sum(len(n.gpus) for n in self.nodes) or 1
        self.total_cpus = sum(n.cpus for n in self.nodes) or 1.0
        self.taken_victims: set[str] = set()
        self.stopping_for: dict[str, tuple[int, list[Running]]] = {}
        self.held: set[int] = set()  # the nodes held for a run (their Use's reserved_for)
        for i, node in enumerate(self.nodes):
            for key in node.cached:
                self.cache_index[key].append(i)
            for r in node.running:
                self.gpus_of["user", r.user] += len(r.gpus)
                self.gpus_of["experiment", r.experiment] += len(r.gpus)
                self.cpus_of[r.user] += r.cpus
                if r.preempted_by is not None:
                    self.taken_victims.add(r.attempt_id)
                    self.stopping_for.setdefault(r.preempted_by, (i, []))[1].append(r)
        # a node whose work is being stopped for a run is held for that run
        for run_id, (i, _) in sorted(self.stopping_for.items()):
            self.uses[i].reserved_for = run_id
            self.held.add(i)
        # nodes alike in everything the checks of one node alone look at share a signature:
        # those checks run once per signature and ask, not once per node and ask
        self.sig_of: list[int] = []
        self.sig_rep: list[int] = []
        sigs: dict[tuple[Any, ...], int] = {}
        for i, node in enumerate(self.nodes):
            sig = (
                tuple((g.index, g.model, g.memory_gb, g.healthy, g.problem) for g in node.gpus),
                node.cpus,
                node.memory_gb,
                node.state,
                node.offline_s is None,
                node.max_tasks == 0,
            )
            if sig not in sigs:
                sigs[sig] = len(self.sig_rep)
                self.sig_rep.append(i)
            self.sig_of.append(sigs[sig])
        binpack = config.scorer == "binpack"
        self.order = sorted(
            range(len(self.nodes)),
            key=lambda i: (-self._taken(i) if binpack else self._taken(i), self.nodes[i].name),
        )
        self.changed_at = [0] * len(self.nodes)  # epoch (len(changes)) of each node's last
        self.by_ask: dict[Ask, _AskView] = {}
        self.by_gpus: dict[tuple[Any, float], list[tuple[str | None, tuple[int, ...]]]] = {}
        self.order_sigs = [self.sig_of[i] for i in self.order]  # each node's of `order`
        self.by_selector: dict[tuple[tuple[str, str], ...], set[int]] = {}
        # key -> value -> nodes: made when a selector first asks, so that each selector is not
        # checked against every node
        self.by_label: dict[str, dict[str, set[int]]] | None = None
        self.by_target: dict[str, set[int]] = {}  # a target -> the nodes it names
        self.version = config.version()
        self.sig_sizes: Counter[int] = Counter(self.sig_of)
        self.sig_by_selector: dict[tuple[tuple[str, str], ...], Counter[int]] = {}
        # when each node's attempts must all have ended by (their max_runtime), if all have one
        self.ends: list[float | None] = []
        for node in self.nodes:
            ends = [r.ends_by for r in node.running]
            known = [e for e in ends if e is not None]
            self.ends.append(max(known) if ends and len(known) == len(ends) else None)

    # --- the queue's order ---------------------------------------------------------------

    def share(self, user: str) -> float:
        """The user's dominant share (DRF): the larger of their share of GPUs and of CPUs,
        over their quota's weight."""
        quota = self.config.quota("user", user)
        weight = quota.weight if quota is not None and quota.weight > 0 else 1.0
        gpus = self.gpus_of["user", user] / self.total_gpus
        cpus = self.cpus_of[user] / self.total_cpus
        return round(max(gpus, cpus) / weight, 9)

    def run(self, queue: list[Request]) -> Plan:
        plan = Plan()
        tiers: dict[int, dict[str, list[Request]]] = defaultdict(lambda: defaultdict(list))
        for req in sorted(queue, key=lambda r: (r.submitted_at, r.run_id)):
            tiers[req.tier][req.user].append(req)
        waiting: list[Request] = []
        for tier in sorted(tiers):
            users = tiers[tier]
            heads = {user: 0 for user in users}
            heap = [(self.share(u), q[0].submitted_at, q[0].run_id, u) for u, q in users.items()]
            heapq.heapify(heap)
            while heap:
                _, _, _, user = heapq.heappop(heap)
                req = users[user][heads[user]]
                heads[user] += 1
                plan.order.append(req.run_id)
                if not self.place(req, plan, len(plan.order)):
                    waiting.append(req)
                if heads[user] < len(users[user]):
                    nxt = users[user][heads[user]]
                    heapq.heappush(heap, (self.share(user), nxt.submitted_at, nxt.run_id, user))
        if self.config.preemption:
            self.preempt(waiting, plan)
        return plan

    # --- placing one run -------------------------------------------------------------------

    def _taken(self, i: int) -> float:
        """How full a node is at the pass's start: its share of GPUs (else slots) in use."""
        node, use = self.nodes[i], self.uses[i]
        if node.gpus:
            return sum(1 for v in use.gpus.values() if v is not None) / len(node.gpus)
        return use.tasks / max(node.max_tasks, 1)

    def _ask(self, ask: Ask) -> _AskView:
        """Per signature, why its nodes can never serve the ask (or None, with the GPUs they
        could give); and the nodes that could, best first."""
        found = self.by_ask.get(ask)
        if found is None:
            # _static per signature, its GPU checks shared by the asks that differ only in
            # CPUs and memory (a queue's asks mostly do)
            per_sig = [
                gpus
                if (verdict := check_totals(ask, self.nodes[rep])) is None
                else _why_not(verdict)
                for rep, gpus in zip(self.sig_rep, self._gpus_per_sig(ask), strict=True)
            ]
            fits_sig = [reason is None for reason, _ in per_sig]
            fits = list(compress(self.order, map(fits_sig.__getitem__, self.order_sigs)))
            found = self.by_ask[ask] = _AskView(ask, per_sig, fits)
        return found

    def _gpus_per_sig(self, ask: Ask) -> list[tuple[str | None, tuple[int, ...]]]:
        """_static's answer per signature where the node has the CPUs and memory: what the
        ask's GPUs (and nothing else of it) make of each."""
        key = (ask.gpu, ask.gpu_share_gb)
        found = self.by_gpus.get(key)
        if found is None:
            found = self.by_gpus[key] = []
            for rep in self.sig_rep:
                node = self.nodes[rep]
                verdict, usable = check_gpus(ask, node)
                verdict = verdict or node_condition(node)
                if verdict is None:
                    verdict, usable = check_health(ask, node, usable)
                found.append((None, usable) if verdict is None else _why_not(verdict))
        return found

    @staticmethod
    def _static(ask: Ask, node: NodeView) -> tuple[Verdict | None, tuple[int, ...]]:
        verdict = check_totals(ask, node)
        usable: tuple[int, ...] = ()
        if verdict is None:
            verdict, usable = check_gpus(ask, node)
        verdict = verdict or node_condition(node)
        if verdict is None:
            verdict, usable = check_health(ask, node, usable)
        return verdict, usable

    def _usable(self, ask: Ask, i: int) -> tuple[int, ...]:
        return self._ask(ask).per_sig[self.sig_of[i]][1]

    def _selected(self, selector: tuple[tuple[str, str], ...]) -> set[int]:
        """The nodes check_selector lets through: those whose label (the first of its key, as
        NodeView.label reads it) is the one wanted, or any value for `*`, for every pair."""
        nodes = self.by_selector.get(selector)
        if nodes is None:
            if self.by_label is None:
                self.by_label = {}
                for i, node in enumerate(self.nodes):
                    first: set[str] = set()
                    for key, value in node.labels:
                        if key not in first:
                            first.add(key)
                            self.by_label.setdefault(key, {}).setdefault(value, set()).add(i)
            nodes = set(range(len(self.nodes)))
            for key, want in selector:
                values: dict[str, set[int]] = self.by_label.get(key, {})
                if want == "*":
                    nodes &= set().union(*values.values())
                else:
                    nodes &= values.get(want, set())
            self.by_selector[selector] = nodes
        return nodes

    def _targeted(self, target: str) -> set[int]:
        """The nodes check_target lets through: named `target`, or of that id."""
        nodes = self.by_target.get(target)
        if nodes is None:
            nodes = {i for i, n in enumerate(self.nodes) if target in (n.name, n.id)}
            self.by_target[target] = nodes
        return nodes

    def shape(self, ask: Ask, req: Request) -> _Shape:
        key: tuple[Any, ...] = (ask, req.selector, req.target)
        if self.filters:  # a site's filter may look at who asks
            key += (req.user, req.experiment, req.tier)
        shape = self.shapes.get(key)
        if shape is not None:
            return shape
        view = self._ask(ask)
        candidates = view.fits
        if req.target:
            candidates = list(filter(self._targeted(req.target).__contains__, candidates))
        if req.selector:
            candidates = list(filter(self._selected(req.selector).__contains__, candidates))
        if self.filters:
            candidates = [
                i for i in candidates if self._plugin_filters(ask, req, self.nodes[i]) is None
            ]
        shape = self.shapes[key] = _Shape(view, candidates)
        return shape

    def _never(self, shape: _Shape, ask: Ask, req: Request) -> Counter[str]:
        """Why each node that could never serve the shape cannot, counted (per signature, not
        per node), and the first few in full: made once, when a run of the shape first waits."""
        if shape.static is not None:
            return shape.static
        if self.filters:
            return self._never_one_by_one(shape, ask, req)
        per_sig = self._ask(ask).per_sig
        static: Counter[str] = Counter()
        chosen = self._selected(req.selector) if req.selector else None
        if req.target:
            hits = sorted(self._targeted(req.target))
            static[Reason.TARGET.value] = len(self.nodes) - len(hits)
            inside: Counter[int] = Counter(
                self.sig_of[i] for i in hits if chosen is None or i in chosen
            )
            if chosen is not None:
                static[Reason.SELECTOR.value] += sum(1 for i in hits if i not in chosen)
        elif chosen is not None:
            static[Reason.SELECTOR.value] = len(self.nodes) - len(chosen)
            inside = self._sig_histogram(req.selector)
        else:
            inside = self.sig_sizes
        for sig, n in inside.items():
            reason = per_sig[sig][0]
            if reason is not None and n:
                static[reason] += n
        static = Counter({r: n for r, n in static.items() if n > 0})
        for i, node in enumerate(self.nodes):  # the first few, in full: their own figures
            if len(shape.samples) >= self.config.top_nodes:
                break
            if i in shape.member:
                continue
            verdict = check_target(req, node)
            if verdict is None and chosen is not None and i not in chosen:
                verdict = check_selector(req, node)
            verdict = verdict or self._static(ask, node)[0]
            if verdict is not None:
                shape.samples.append(verdict)
        shape.static = static
        return static

    def _never_one_by_one(self, shape: _Shape, ask: Ask, req: Request) -> Counter[str]:
        """_never where a site's filters run: they look at each node."""
        static: Counter[str] = Counter()
        for i, node in enumerate(self.nodes):
            if i in shape.member:
                continue
            verdict = check_target(req, node) or check_selector(req, node)
            verdict = verdict or self._static(ask, node)[0]
            verdict = verdict or self._plugin_filters(ask, req, node)
            if verdict is None:
                continue
            static[verdict.reason.value] += 1
            if len(shape.samples) < self.config.top_nodes:
                shape.samples.append(verdict)
        shape.static = static
        return static

    def _sig_histogram(self, selector: tuple[tuple[str, str], ...]) -> Counter[int]:
        found = self.sig_by_selector.get(selector)
        if found is None:
            found = Counter(self.sig_of[i] for i in self._selected(selector))
            self.sig_by_selector[selector] = found
        return found

    def _plugin_filters(self, ask: Ask, req: Request, node: NodeView) -> Verdict | None:
        for name in self.config.filters:
            said = self.filters[name](ask, req, node)
            if said:
                return Verdict(node.name, Reason.PLUGIN, detail=f"{name}: {said}")
        return None

    def _quota(self, req: Request, ask: Ask) -> dict[str, Any] | None:
        need = ask.gpu.count * req.num_nodes
        if not need:
            return None
        for scope, name in (("user", req.user), ("experiment", req.experiment)):
            quota = self.config.quota(scope, name)
            if quota is not None and self.gpus_of[scope, name] + need > quota.gpus:
                return {
                    "scope": scope,
                    "name": name,
                    "asked": need,
                    "used": self.gpus_of[scope, name],
                    "limit": quota.gpus,
                }
        return None

    def place(self, req: Request, plan: Plan, position: int) -> bool:
        tried: list[dict[str, Any]] = []
        for n, ask in enumerate(req.alternatives):
            over = self._quota(req, ask)
            if over is not None:
                tried.append({"ask": ask.text(), "quota": over})
                continue
            shape = self.shape(ask, req)
            found, considered = self._find(shape, ask, req, req.num_nodes)
            if found is not None:
                nodes = []
                for i, gpus in found:
                    self._take(i, ask, req, gpus)
                    nodes.append((self.nodes[i].id, self.nodes[i].name, gpus))
                placement = Placement(req.run_id, req.attempt_id, n, tuple(nodes), ask)
                plan.placements.append(placement)
                chosen = {
                    "alternative": n,
                    "ask": shape.view.text,
                    "considered": considered,
                    "nodes": [{"node": name, "gpus": list(g)} for _, name, g in nodes],
                }
                plan.decisions[req.run_id] = self._record(
                    req, position, "placed", tried, chosen=chosen
                )
                return True
            tried.append(self._why(shape, ask, req))
        reserved = self._reserve(req) if not any("quota" in t for t in tried) else None
        record = self._record(req, position, "waiting", tried, reserved=reserved)
        record["estimated_start"] = self._estimate(req)
        plan.decisions[req.run_id] = record
        return False

    def _find(
        self, shape: _Shape, ask: Ask, req: Request, count: int
    ) -> tuple[list[tuple[int, tuple[int, ...]]] | None, int]:
        """The `count` best nodes for the ask (with the GPUs each gives), or None; and how
        many nodes were looked at."""
        want = max(self.config.score_nodes, count)
        window: list[tuple[int, tuple[int, ...]]] = []
        looked = 0
        view = shape.view
        usable, full, room = view.per_sig, view.full, view.room
        sig_of, nodes, uses, dead = self.sig_of, self.nodes, self.uses, shape.dead
        changed_at = self.changed_at
        run_id = req.run_id
        live = shape.live
        # most looks start with nodes that other shapes of the ask found full since this one
        # last looked (the fullest come first under binpack, and fill first): where none of
        # them is held for a run, they are counted as looked at and leave the list in one go,
        # as the loop below would one by one
        ahead = len(list(takewhile(full.__contains__, live))) if want else 0
        if ahead and self.held.isdisjoint(islice(live, ahead)):
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
        if self.weights.get("cached") and req.cache_keys:
            seen = {i for i, _ in window}
            for key in req.cache_keys:
                for i in self.cache_index.get(key, ()):
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
        scoring, best = self.scoring, []
        for r, (i, _) in enumerate(window):
            node, use = nodes[i], uses[i]
            # sum() of the weighted scores in the weights' order: the same float every time
            total = sum([w * scorer(ask, req, node, use) for scorer, w in scoring])
            best.append((-round(float(total), 9), r))
        best.sort()
        return [window[r] for _, r in best[:count]], looked

    def _take(self, i: int, ask: Ask, req: Request, gpus: tuple[int, ...]) -> None:
        use = self.uses[i]
        use.tasks += 1
        for g in gpus:
            used = use.gpus.get(g)
            use.set_gpu(g, 0.0 if not ask.gpu_share_gb else (used or 0.0) + ask.gpu_share_gb)
        use.cpus += ask.cpus
        use.memory_gb += ask.memory_gb
        self.gpus_of["user", req.user] += len(gpus)
        self.gpus_of["experiment", req.experiment] += len(gpus)
        self.cpus_of[req.user] += ask.cpus
        self._changed(i)

    def _changed(self, i: int) -> None:
        self.changes.append(i)
        self.changed_at[i] = len(self.changes)

    # --- why a run waits --------------------------------------------------------------------

    def _why(self, shape: _Shape, ask: Ask, req: Request) -> dict[str, Any]:
        """Counts per reason over every node for one alternative, and the nodes nearest to
        fitting in full. A node's reason is made again only where the node changed since it
        was made (and once for all shapes of the ask); the record is made again only where
        one did; the figures are made only for the nodes the record describes in full."""
        epoch = len(self.changes)
        now = self._reasons(shape.view, ask)
        if shape.wait is None:
            shape.wait = {i: now[i] for i in shape.candidates}
            shape.counts = Counter(shape.wait.values())
        elif shape.wait_epoch != epoch:
            wait, counts = shape.wait, shape.counts
            changed = self._changed_since(shape.wait_epoch, shape.candidates, shape.member)
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
        counts = Counter(self._never(shape, ask, req))
        counts.update({r: n for r, n in shape.counts.items() if r != FITS and n > 0})
        top: list[Verdict] = []
        for i in shape.candidates:
            if len(top) >= self.config.top_nodes:
                break
            if shape.wait[i] != FITS:
                verdict = self._busy(shape.view, ask, i)  # as `wait` saw it: the same verdict
                if verdict is not None:
                    top.append(verdict)
        top += shape.samples[: self.config.top_nodes - len(top)]
        out: dict[str, Any] = {
            "ask": shape.view.text,
            "counts": dict(sorted(counts.items())),
            "nodes": [v.record() for v in top],
        }
        if shape.counts.get(FITS, 0) > 0:
            out["fits"] = shape.counts[FITS]  # fewer than a gang needs
        shape.record = out
        return dict(out)

    def _reasons(self, view: _AskView, ask: Ask) -> dict[int, str]:
        """Why each node that could ever serve the ask cannot take it now (FITS: it can), for
        anyone (a hold for a run counts against every run here). Made once per ask, not per
        shape, and made again only for the nodes changed since."""
        epoch = len(self.changes)
        if view.reasons is not None and view.epoch == epoch:
            return view.reasons
        if view.reasons is None:
            todo: list[int] | set[int] = view.fits
            view.reasons = {}
        else:
            todo = self._changed_since(view.epoch, view.fits, view.reasons)
        reasons, per_sig, sig_of, nodes, uses = (
            view.reasons,
            view.per_sig,
            self.sig_of,
            self.nodes,
            self.uses,
        )
        for i in todo:
            reasons[i] = busy_reason(ask, _NOBODY, nodes[i], uses[i], per_sig[sig_of[i]][1]) or FITS
        view.epoch = epoch
        return reasons

    def _changed_since(
        self, epoch: int, nodes: list[int], member: set[int] | dict[int, str]
    ) -> list[int] | set[int]:
        """Which of `nodes` (`member`: the same, to look up) changed since `epoch`: from the
        changes or from the nodes, whichever is shorter to go through (the same either way)."""
        if len(self.changes) - epoch < len(nodes):
            return {i for i in self.changes[epoch:] if i in member}
        changed_at = self.changed_at
        return [i for i in nodes if changed_at[i] > epoch]

    def _busy(self, view: _AskView, ask: Ask, i: int) -> Verdict | None:
        """_reasons' verdict in full, with its figures: for the few nodes a record describes.
        Those are much the same nodes from one waiting run to the next: a verdict is kept
        per ask until its node changes."""
        at = self.changed_at[i]
        kept = view.verdicts.get(i)
        if kept is None or kept[0] != at:
            usable = view.per_sig[self.sig_of[i]][1]
            verdict = check_free(ask, _NOBODY, self.nodes[i], self.uses[i], usable)[0]
            kept = view.verdicts[i] = (at, verdict)
        return kept[1]

    def _estimate(self, req: Request) -> float | None:
        """When the run could start, as Slurm's backfill guesses it: the soonest that every
        attempt on a node that is only busy for it has to end by (its max_runtime), as the
        snapshot has them; None where some attempt there has no limit, or no node is merely
        busy. Made once per shape and pass."""
        best: float | None = None
        for ask in req.alternatives:
            shape = self.shape(ask, req)
            if shape.wait is None:
                continue
            if shape.estimate is None:
                shape.estimate = (0, self._soonest(shape))
            at = shape.estimate[1]
            if at is not None:
                best = at if best is None else min(best, at)
        return None if best is None else round(max(best, self.at), 1)

    def _soonest(self, shape: _Shape) -> float | None:
        found = [
            end
            for i, reason in (shape.wait or {}).items()
            if reason in BUSY_REASONS and (end := self.ends[i]) is not None
        ]
        return min(found) if found else None

    def _reserve(self, req: Request) -> str | None:
        """A run that has waited past reserve_after_s holds the node nearest to fitting it
        (busy only, not reserved already): nothing behind it takes room there meanwhile."""
        if self.at - req.submitted_at < self.config.reserve_after_s:
            return None
        ask = req.alternatives[0]
        shape = self.shape(ask, req)
        now = self._reasons(shape.view, ask)
        for i in shape.candidates:
            use = self.uses[i]
            if use.reserved_for is not None:
                continue
            if now[i] in BUSY_REASONS:
                use.reserved_for = req.run_id
                self.held.add(i)
                self._changed(i)
                return self.nodes[i].name
        return None

    # --- making room --------------------------------------------------------------------------

    def preempt(self, waiting: list[Request], plan: Plan) -> None:
        """For each run that waits, most urgent first: the node where stopping the fewest,
        cheapest preemptible attempts of lower tiers makes it fit. A node that had work pushed
        off within preempt_cooldown_s is left alone, and a pass pushes off at most
        max_preemptions_per_pass nodes' worth: no churn."""
        made = 0
        for req in waiting:
            record = plan.decisions[req.run_id]
            if req.run_id in self.stopping_for:
                i, victims = self.stopping_for[req.run_id]
                record["outcome"] = "preempting"
                record["reserved"] = self.nodes[i].name
                record["victims"] = [_victim(v, self.nodes[i].name, self.config) for v in victims]
                continue
            if made >= self.config.max_preemptions_per_pass:
                continue
            if any("quota" in t for t in record["alternatives"]):
                continue
            best = self._cheapest(req)
            if best is None:
                continue
            i, victims = best
            node = self.nodes[i]
            self.uses[i].reserved_for = req.run_id
            self.held.add(i)
            self.taken_victims.update(v.attempt_id for v in victims)
            plan.preemptions.append(Preemption(req.run_id, node.id, node.name, tuple(victims)))
            record["outcome"] = "preempting"
            record["reserved"] = node.name
            record["victims"] = [_victim(v, node.name, self.config) for v in victims]
            made += 1

    def _cheapest(self, req: Request) -> tuple[int, list[Running]] | None:
        best: tuple[tuple[float, ...], int, list[Running]] | None = None
        for ask in req.alternatives:
            if req.num_nodes != 1:
                break  # a gang waits for its nodes: pushing work off several at once is not
            shape = self.shape(ask, req)
            for i in shape.candidates:
                node = self.nodes[i]
                if node.preempted_at is not None and (
                    self.at - node.preempted_at < self.config.preempt_cooldown_s
                ):
                    continue
                use = self.uses[i]
                if use.reserved_for not in (None, req.run_id):
                    continue
                pool = sorted(
                    (
                        r
                        for r in node.running
                        if r.preemptible
                        and r.tier > req.tier
                        and r.attempt_id not in self.taken_victims
                    ),
                    key=lambda r: (-r.tier, -r.started_at, r.attempt_id),
                )
                victims = _fewest(ask, req, node, use, self._usable(ask, i), pool)
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

    # --- the record --------------------------------------------------------------------------

    def _record(
        self,
        req: Request,
        position: int,
        outcome: str,
        tried: list[dict[str, Any]],
        chosen: dict[str, Any] | None = None,
        reserved: str | None = None,
    ) -> dict[str, Any]:
        tiers = self.config.tiers
        return {
            "run": req.run_id,
            "attempt": req.attempt_id,
            "outcome": outcome,
            "tier": tiers[req.tier] if req.tier < len(tiers) else str(req.tier),
            "position": position,
            "waited_s": round(max(0.0, self.at - req.submitted_at), 1),
            "nodes_total": len(self.nodes),
            "alternatives": tried,
            "chosen": chosen,
            "reserved": reserved,
            "victims": [],
            "snapshot": self.snapshot.version,
            "config": self.version,
        }


_NOBODY = Request(run_id="", attempt_id="", alternatives=(), submitted_at=0.0)


def _why_not(verdict: Verdict) -> tuple[str, tuple[int, ...]]:
    """A signature's verdict as a pass keeps it: its reason alone (the figures are made again
    for the few nodes a record describes). Thousands of these live through a pass: plain
    strings, unlike Verdicts, are not walked by each of its garbage collections."""
    return verdict.reason.value, ()


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


def _victim(v: Running, node: str, config: SchedConfig) -> dict[str, Any]:
    return {
        "attempt": v.attempt_id,
        "run": v.run_id,
        "node": node,
        "tier": config.tiers[v.tier] if v.tier < len(config.tiers) else str(v.tier),
        "gpus": len(v.gpus),
    }


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
    return Pass(snapshot, config, filters, scorers).run(queue)
