"""What a scheduling pass hands back: the placements to commit, the attempts to push off, and a
record per run of what the pass decided for it and why (what `orbit explain` reads, and
--replay compares)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orbit.scheduler.model import Ask, Request, Running, SchedConfig

if TYPE_CHECKING:
    from orbit.scheduler.pass_state import Pass


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


def decision_record(
    p: Pass,
    req: Request,
    position: int,
    outcome: str,
    tried: list[dict[str, Any]],
    chosen: dict[str, Any] | None = None,
    reserved: str | None = None,
) -> dict[str, Any]:
    tiers = p.config.tiers
    return {
        "run": req.run_id,
        "attempt": req.attempt_id,
        "outcome": outcome,
        "tier": tiers[req.tier] if req.tier < len(tiers) else str(req.tier),
        "position": position,
        "waited_s": round(max(0.0, p.at - req.submitted_at), 1),
        "nodes_total": len(p.nodes),
        "alternatives": tried,
        "chosen": chosen,
        "reserved": reserved,
        "victims": [],
        "snapshot": p.snapshot.version,
        "config": p.version,
    }


def victim_record(v: Running, node: str, config: SchedConfig) -> dict[str, Any]:
    return {
        "attempt": v.attempt_id,
        "run": v.run_id,
        "node": node,
        "tier": config.tiers[v.tier] if v.tier < len(config.tiers) else str(v.tier),
        "gpus": len(v.gpus),
    }
