"""What one pass knows of the nodes as it goes: each node's usage (the snapshot's, then the
pass's own placements on top), the fair-share tallies, the nodes held for a run, and what each
ask makes of the nodes.

Cost: each distinct ask (its alternative, selector and target) is filtered against every node
once per pass; after that a placement looks at the first few nodes of a list from which those
found full for that ask are dropped (usage only grows within a pass), and scores
`score_nodes` feasible ones, as the Kubernetes scheduler and Nomad do rather than scoring
every node. What depends on the ask alone (which nodes could serve it, which are full for it,
what room each has, why each cannot take it now) is worked out once per ask and shared by its
shapes: a queue has many selectors over few asks; and kept until the node it is about
changes: a placement changes one node or a few."""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import compress
from typing import Any

from orbit.scheduler.filters import (
    Use,
    check_gpus,
    check_health,
    check_totals,
    node_condition,
)
from orbit.scheduler.model import Ask, NodeView, Request, Running, SchedConfig, Snapshot
from orbit.scheduler.reasons import Reason, Verdict
from orbit.scheduler.scorers import SCORERS


class AskView:
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
        self.reasons: dict[int, str] | None = None  # node of `fits` -> its reason, or waiting.FITS
        self.epoch = -1
        # node -> (its changed_at, check_free's verdict then): see waiting._busy
        self.verdicts: dict[int, tuple[int, Verdict | None]] = {}


class Shape:
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

    def __init__(self, view: AskView, candidates: list[int]) -> None:
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
    """The state of one pass over a snapshot under a config (as the module says);
    orbit.scheduler.ordering runs the pass over it."""

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
        self.shapes: dict[tuple[Any, ...], Shape] = {}
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
        self.by_ask: dict[Ask, AskView] = {}
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

    def _taken(self, i: int) -> float:
        """How full a node is at the pass's start: its share of GPUs (else slots) in use."""
        node, use = self.nodes[i], self.uses[i]
        if node.gpus:
            return sum(1 for v in use.gpus.values() if v is not None) / len(node.gpus)
        return use.tasks / max(node.max_tasks, 1)

    def ask_view(self, ask: Ask) -> AskView:
        """Per signature, why its nodes can never serve the ask (or None, with the GPUs they
        could give); and the nodes that could, best first."""
        found = self.by_ask.get(ask)
        if found is None:
            # static per signature, its GPU checks shared by the asks that differ only in
            # CPUs and memory (a queue's asks mostly do)
            per_sig = [
                gpus
                if (verdict := check_totals(ask, self.nodes[rep])) is None
                else _why_not(verdict)
                for rep, gpus in zip(self.sig_rep, self._gpus_per_sig(ask), strict=True)
            ]
            fits_sig = [reason is None for reason, _ in per_sig]
            fits = list(compress(self.order, map(fits_sig.__getitem__, self.order_sigs)))
            found = self.by_ask[ask] = AskView(ask, per_sig, fits)
        return found

    def _gpus_per_sig(self, ask: Ask) -> list[tuple[str | None, tuple[int, ...]]]:
        """static's answer per signature where the node has the CPUs and memory: what the
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
    def static(ask: Ask, node: NodeView) -> tuple[Verdict | None, tuple[int, ...]]:
        verdict = check_totals(ask, node)
        usable: tuple[int, ...] = ()
        if verdict is None:
            verdict, usable = check_gpus(ask, node)
        verdict = verdict or node_condition(node)
        if verdict is None:
            verdict, usable = check_health(ask, node, usable)
        return verdict, usable

    def usable(self, ask: Ask, i: int) -> tuple[int, ...]:
        return self.ask_view(ask).per_sig[self.sig_of[i]][1]

    def selected(self, selector: tuple[tuple[str, str], ...]) -> set[int]:
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

    def targeted(self, target: str) -> set[int]:
        """The nodes check_target lets through: named `target`, or of that id."""
        nodes = self.by_target.get(target)
        if nodes is None:
            nodes = {i for i, n in enumerate(self.nodes) if target in (n.name, n.id)}
            self.by_target[target] = nodes
        return nodes

    def shape(self, ask: Ask, req: Request) -> Shape:
        key: tuple[Any, ...] = (ask, req.selector, req.target)
        if self.filters:  # a site's filter may look at who asks
            key += (req.user, req.experiment, req.tier)
        shape = self.shapes.get(key)
        if shape is not None:
            return shape
        view = self.ask_view(ask)
        candidates = view.fits
        if req.target:
            candidates = list(filter(self.targeted(req.target).__contains__, candidates))
        if req.selector:
            candidates = list(filter(self.selected(req.selector).__contains__, candidates))
        if self.filters:
            candidates = [
                i for i in candidates if self.plugin_filters(ask, req, self.nodes[i]) is None
            ]
        shape = self.shapes[key] = Shape(view, candidates)
        return shape

    def sig_histogram(self, selector: tuple[tuple[str, str], ...]) -> Counter[int]:
        found = self.sig_by_selector.get(selector)
        if found is None:
            found = Counter(self.sig_of[i] for i in self.selected(selector))
            self.sig_by_selector[selector] = found
        return found

    def plugin_filters(self, ask: Ask, req: Request, node: NodeView) -> Verdict | None:
        for name in self.config.filters:
            said = self.filters[name](ask, req, node)
            if said:
                return Verdict(node.name, Reason.PLUGIN, detail=f"{name}: {said}")
        return None

    def take(self, i: int, ask: Ask, req: Request, gpus: tuple[int, ...]) -> None:
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
        self.changed(i)

    def changed(self, i: int) -> None:
        self.changes.append(i)
        self.changed_at[i] = len(self.changes)

    def changed_since(
        self, epoch: int, nodes: list[int], member: set[int] | dict[int, str]
    ) -> list[int] | set[int]:
        """Which of `nodes` (`member`: the same, to look up) changed since `epoch`: from the
        changes or from the nodes, whichever is shorter to go through (the same either way)."""
        if len(self.changes) - epoch < len(nodes):
            return {i for i in self.changes[epoch:] if i in member}
        changed_at = self.changed_at
        return [i for i in nodes if changed_at[i] > epoch]


def _why_not(verdict: Verdict) -> tuple[str, tuple[int, ...]]:
    """A signature's verdict as a pass keeps it: its reason alone (the figures are made again
    for the few nodes a record describes). Thousands of these live through a pass: plain
    strings, unlike Verdicts, are not walked by each of its garbage collections."""
    return verdict.reason.value, ()
