"""What the scheduler reads: a snapshot of nodes (what each has, what runs there), the queue of
runs waiting to be placed (what each asks, in order of preference), and the config that
weighs them. Plain frozen values, built by the store's snapshot and by tests alike; the
scheduler never reads anything else, so that the same inputs always give the same plan."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

from orbit.scheduler.resources import GpuAsk

DEFAULT_TIERS = ("urgent", "high", "normal", "batch")
NO_GPU = GpuAsk(count=0)


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    model: str  # the catalog's name where known (orbit.scheduler.resources), else NVML's
    memory_gb: float
    used_gb: float | None = None  # None: free; 0: taken whole; > 0: that much reserved
    healthy: bool = True
    problem: str = ""  # why not healthy: "xid 79", "ecc 3 uncorrected", "off the bus"


@dataclass(frozen=True, slots=True)
class Running:
    """An attempt placed on a node that has not ended: what it holds, and whether it may be
    pushed off for more urgent work."""

    attempt_id: str
    run_id: str
    tier: int  # rank in the config's tiers: 0 is the most urgent
    preemptible: bool
    gpus: tuple[int, ...]
    gpu_share_gb: float  # per GPU; 0: whole GPUs
    cpus: float
    memory_gb: float
    user: str
    experiment: str
    started_at: float  # epoch seconds
    ends_by: float | None = None  # epoch seconds: its max_runtime, or its progress's ETA
    preempted_by: str | None = None  # the run it is being stopped for, once it is


@dataclass(frozen=True, slots=True)
class NodeView:
    id: str
    name: str
    labels: tuple[tuple[str, str], ...]
    state: str  # active | cordoned | revoked
    offline_s: float | None  # None: online; else how long it has been silent
    max_tasks: int
    gpus: tuple[Gpu, ...] = ()
    cpus: float = 0.0  # 0: not known (not checked)
    memory_gb: float = 0.0
    disk_free_gb: float = 0.0
    running: tuple[Running, ...] = ()
    cached: frozenset[str] = frozenset()  # models, datasets, bundle digests it holds
    kind: str = "agent"  # agent | ssh
    preempted_at: float | None = None  # the last time work was pushed off it (rate limit)

    def label(self, key: str) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return None


@dataclass(frozen=True, slots=True)
class Ask:
    """One alternative of a request: everything one node must give."""

    gpu: GpuAsk = NO_GPU
    gpu_share_gb: float = 0.0  # reserve this much on each GPU (runs share it); 0: whole GPUs
    cpus: float = 0.0
    memory_gb: float = 0.0
    disk_gb: float = 0.0

    def text(self) -> str:
        parts = [f"gpu {self.gpu.text()}"]
        if self.gpu_share_gb:
            parts.append(f"{self.gpu_share_gb:g} GB of each")
        if self.cpus:
            parts.append(f"{self.cpus:g} cpu")
        if self.memory_gb:
            parts.append(f"{self.memory_gb:g} GB ram")
        if self.disk_gb:
            parts.append(f"{self.disk_gb:g} GB disk")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Request:
    """A run waiting to be placed: its alternatives in order (the first that fits wins)."""

    run_id: str
    attempt_id: str
    alternatives: tuple[Ask, ...]
    submitted_at: float  # epoch seconds: the queue's FIFO order, and its wait
    tier: int = 2  # rank in the config's tiers
    preemptible: bool = False
    selector: tuple[tuple[str, str], ...] = ()
    target: str | None = None
    num_nodes: int = 1
    user: str = ""
    experiment: str = ""
    cache_keys: tuple[str, ...] = ()  # what it would like to find on the node already
    max_runtime_s: float | None = None


@dataclass(frozen=True, slots=True)
class Quota:
    scope: str  # user | experiment
    name: str
    gpus: int  # at most this many GPUs at once
    weight: float = 1.0  # fair-share weight: a heavier one gets a larger share


@dataclass(frozen=True)
class SchedConfig:
    tiers: tuple[str, ...] = DEFAULT_TIERS
    scorer: str = "binpack"  # binpack | spread
    weights: dict[str, float] = field(
        default_factory=lambda: {"binpack": 1.0, "spread": 1.0, "cached": 0.5}
    )
    # nodes scored per placement once feasible ones are found (Kubernetes scores a share of
    # the feasible nodes, Nomad a handful): more costs time, not correctness
    score_nodes: int = 8
    reserve_after_s: float = 1800.0  # a run waiting this long reserves the node it needs
    # off until the control plane stops victims and resumes them (the pure pass plans it)
    preemption: bool = False
    preempt_cooldown_s: float = 300.0  # a node that had work pushed off waits this long
    max_preemptions_per_pass: int = 4
    quotas: tuple[Quota, ...] = ()
    top_nodes: int = 5  # nodes described in full in a decision
    filters: tuple[str, ...] = ()  # a site's own filters (entry points), by name

    def version(self) -> str:
        """A short digest of everything here: a decision names the config it was made under."""
        body = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()[:12]

    def tier_rank(self, name: str) -> int | None:
        try:
            return self.tiers.index(name)
        except ValueError:
            return None

    def quota(self, scope: str, name: str) -> Quota | None:
        for quota in self.quotas:
            if quota.scope == scope and quota.name == name:
                return quota
        return None


@dataclass(frozen=True)
class Snapshot:
    """The nodes as one pass saw them. `version` names it in decisions (and finds it again
    for a replay); `at` is the pass's clock, epoch seconds."""

    version: str
    at: float
    nodes: tuple[NodeView, ...]
