"""Nodes: in-house servers whose agents connect out to the control plane. Records and the pure
rules about them (online or not, what they have free, where an attempt fits); the store keeps
them and orbit.agent.protocol is how their agents talk."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

from orbit.core.config import HEARTBEAT_S as HEARTBEAT_S
from orbit.core.config import LOST_GRACE_S as LOST_GRACE_S
from orbit.core.config import OFFLINE_AFTER_S

MAX_TRANSFER_BYTES = 48 * 1024 * 1024  # `orbit nodes push` or `pull` moves one file up to this


class NodeState(StrEnum):
    ACTIVE = "active"
    CORDONED = "cordoned"  # takes no new work; what it runs goes on
    REVOKED = "revoked"  # its credential is refused; it gets nothing


class NodeRecord(BaseModel):
    model_config = ConfigDict(frozen=True)
    id: str
    name: str
    labels: dict[str, str]
    info: dict[str, Any]  # orbit.agent.protocol.NodeInfo
    state: NodeState
    max_tasks: int
    created_at: datetime
    created_by: str
    last_seen_at: datetime | None
    running: tuple[str, ...] = ()  # its attempts that have not ended (placed or started)
    gpus_in_use: dict[int, float] = {}  # GPU index -> GB reserved there (0: the whole GPU)
    # the offline timeout of the control plane that gave this record: a reader elsewhere (the
    # CLI against a server) judges online and condition as that control plane does
    offline_after_s: float = OFFLINE_AFTER_S

    def seen_ago(self, now: datetime) -> float | None:
        if self.last_seen_at is None:
            return None
        return max(0.0, (now - self.last_seen_at).total_seconds())

    def online(self, now: datetime, offline_after_s: float | None = None) -> bool:
        ago = self.seen_ago(now)
        limit = self.offline_after_s if offline_after_s is None else offline_after_s
        return ago is not None and ago < limit

    def condition(self, now: datetime, offline_after_s: float | None = None) -> str:
        """What a person reading `orbit nodes list` wants to know first."""
        if self.state is NodeState.REVOKED:
            return "revoked"
        if not self.online(now, offline_after_s):
            return "offline"
        if self.state is NodeState.CORDONED:
            return "cordoned" if self.running else "cordoned (free)"
        if self.max_tasks == 0:
            return "draining" if self.running else "drained (free for people)"
        return "busy" if len(self.running) >= self.max_tasks else "ready"


class JoinTokenRecord(BaseModel):
    model_config = ConfigDict(frozen=True)
    id: str
    labels: dict[str, str]
    created_at: datetime
    created_by: str
    expires_at: datetime | None
    revoked_at: datetime | None
    uses: int


class NewJoinToken(BaseModel):
    """A join token as made: the only time its value is shown."""

    model_config = ConfigDict(frozen=True)
    record: JoinTokenRecord
    token: str


@dataclass(frozen=True)
class Fit:
    """Where an attempt fits on a node: the GPU indices it gets, and the reservation on each."""

    node: NodeRecord
    gpu_indices: tuple[int, ...]
    gpu_memory_gb: float  # per GPU; 0: whole GPUs


def matches(labels: dict[str, str], selector: dict[str, Any]) -> bool:
    """Every selector key present with the same value (`*`: present with any value)."""
    for key, want in selector.items():
        have = labels.get(str(key))
        if have is None or (str(want) != "*" and have != str(want)):
            return False
    return True


def fit_gpus(
    node: NodeRecord, count: int, gpu_memory_gb: float, gpu_type: str | None
) -> tuple[int, ...] | None:
    """The GPU indices an attempt asking for `count` GPUs gets on `node`, or None. A whole-GPU
    request (`gpu_memory_gb` 0) takes GPUs nobody uses; a reservation takes GPUs whose memory
    still has room for it beside the other reservations there."""
    if count == 0:
        return ()
    free: list[int] = []
    for gpu in node.info.get("accelerators", ()):
        index = int(gpu.get("index", -1))
        model = str(gpu.get("model", ""))
        if gpu_type and gpu_type.lower() not in model.lower():
            continue
        used = node.gpus_in_use.get(index)
        total_gb = float(gpu.get("memory_mb", 0)) / 1024
        if gpu_memory_gb <= 0:
            if used is None:
                free.append(index)
        elif used != 0.0 and (used or 0.0) + gpu_memory_gb <= total_gb:
            free.append(index)
        if len(free) == count:
            return tuple(free)
    return None


def no_gpus_why(node: NodeRecord, count: int, gpu_memory_gb: float, gpu_type: str | None) -> str:
    """Why `fit_gpus` found no room on `node`: it never will (too few GPUs of the type, too
    little memory on each for the reservation), or not until what runs there ends."""
    kind = f"{gpu_type} " if gpu_type else ""
    gpus = [
        gpu
        for gpu in node.info.get("accelerators", ())
        if not gpu_type or gpu_type.lower() in str(gpu.get("model", "")).lower()
    ]
    if len(gpus) < count:
        return f"has {_gpus(len(gpus), kind)}, {count} asked"
    if gpu_memory_gb > 0:
        roomy = [g for g in gpus if float(g.get("memory_mb", 0)) / 1024 >= gpu_memory_gb]
        if len(roomy) < count:
            return f"has {_gpus(len(roomy), kind)} of {gpu_memory_gb:g} GB or more, {count} asked"
    return "not enough free GPUs"


def _gpus(n: int, kind: str) -> str:
    return f"{n} {kind}GPU{'' if n == 1 else 's'}"


def place(
    nodes: list[NodeRecord],
    now: datetime,
    selector: dict[str, Any],
    gpu_count: int,
    gpu_memory_gb: float = 0.0,
    gpu_type: str | None = None,
    offline_after_s: float = OFFLINE_AFTER_S,
) -> tuple[Fit | None, dict[str, str]]:
    """The node an attempt goes to (the least busy that fits), or None with why each node was
    passed over (node name -> reason). Pure."""
    why: dict[str, str] = {}
    fits: list[Fit] = []
    for node in nodes:
        if node.state is not NodeState.ACTIVE:
            why[node.name] = str(node.state)
        elif not node.online(now, offline_after_s):
            why[node.name] = "offline"
        elif not matches(node.labels, selector):
            why[node.name] = "labels do not match the selector"
        elif len(node.running) >= node.max_tasks:
            why[node.name] = "draining" if node.max_tasks == 0 else "full"
        else:
            gpus = fit_gpus(node, gpu_count, gpu_memory_gb, gpu_type)
            if gpus is None:
                why[node.name] = no_gpus_why(node, gpu_count, gpu_memory_gb, gpu_type)
            else:
                fits.append(Fit(node, gpus, gpu_memory_gb))
    if not fits:
        return None, why
    best = min(fits, key=lambda f: (len(f.node.running) / max(f.node.max_tasks, 1), f.node.name))
    return best, why
