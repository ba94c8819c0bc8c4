"""Why a node will not do: a reason from a closed set, with the figures behind it (requested,
used, capacity) in a Verdict; never a sentence (orbit.cli.explain makes those).

Reasons come in three classes, kept apart because they mean different things to the person
waiting: `never` (this node can never hold the request: wrong model, too few GPUs, labels),
`unavailable` (the node is offline, cordoned, draining, or a GPU is unhealthy: it may come
back), and `busy` (full right now: it will have room once its work ends)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Reason(StrEnum):
    # never: the node can never hold this ask
    TARGET = "target"
    SELECTOR = "selector"
    GPU_MODEL = "gpu_model"
    GPU_MEMORY = "gpu_memory"
    GPU_COUNT = "gpu_count"
    CPU_TOTAL = "cpu_total"
    MEMORY_TOTAL = "memory_total"
    # unavailable: the node, or some of its GPUs, cannot take work now and may again
    REVOKED = "revoked"
    CORDONED = "cordoned"
    DRAINING = "draining"
    OFFLINE = "offline"
    UNHEALTHY = "unhealthy"
    # busy: it will have room once work there ends
    SLOTS = "slots"
    GPUS_BUSY = "gpus_busy"
    CPUS_BUSY = "cpus_busy"
    MEMORY_BUSY = "memory_busy"
    DISK = "disk"
    RESERVED = "reserved"
    PLUGIN = "plugin"  # a site's own filter said no (its name in the verdict's detail)

    @property
    def kind(self) -> str:
        return KINDS[self]


NEVER, UNAVAILABLE, BUSY = "never", "unavailable", "busy"
KINDS = {
    **{r: NEVER for r in ("target", "selector", "gpu_model", "gpu_memory", "gpu_count")},
    **{r: NEVER for r in ("cpu_total", "memory_total")},
    **{r: UNAVAILABLE for r in ("revoked", "cordoned", "draining", "offline", "unhealthy")},
    **{r: BUSY for r in ("slots", "gpus_busy", "cpus_busy", "memory_busy", "disk", "reserved")},
    "plugin": NEVER,
}
KINDS = {Reason(k): v for k, v in KINDS.items()}


@dataclass(frozen=True, slots=True)
class Verdict:
    """Why one node will not do, in figures. `asked`, `used`, `capacity` are what the reason
    compares (GPUs, GB, slots; model names for gpu_model); `detail` is a datum for the reader
    (the run a node is reserved for, the GPU that is unhealthy), never a sentence."""

    node: str
    reason: Reason
    asked: float | str | None = None
    used: float | str | None = None
    capacity: float | str | None = None
    detail: str = ""

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.node, "reason": self.reason.value}
        for key in ("asked", "used", "capacity"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.detail:
            out["detail"] = self.detail
        return out
