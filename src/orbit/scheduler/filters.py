"""The filters of a placement, each small and pure, cheapest first: those that need only the
node (kept per pass and shape of ask), then those of what the node has free right now (its
Use in the pass). Each says why a node will not do (a Verdict) or nothing."""

from __future__ import annotations

from collections.abc import Callable

from orbit.scheduler.model import Ask, Gpu, NodeView, Request
from orbit.scheduler.reasons import Reason, Verdict


class Use:
    """What a node has given out during one pass: its snapshot's usage, then this pass's own
    placements on top. Only ever grows within a pass (nothing ends mid-pass)."""

    __slots__ = ("cpus", "gpu_gb", "gpus", "memory_gb", "reserved_for", "size", "taken", "tasks")

    def __init__(self, node: NodeView) -> None:
        self.tasks = len(node.running)
        self.gpus: dict[int, float | None] = {g.index: g.used_gb for g in node.gpus}
        self.gpu_gb = {g.index: g.memory_gb for g in node.gpus}
        self.cpus = sum(r.cpus for r in node.running)
        self.memory_gb = sum(r.memory_gb for r in node.running)
        self.reserved_for: str | None = None
        # how many of `gpus` are not free, kept by set_gpu: the scorers and a quick "too few
        # free" answer read it instead of counting the GPUs again on every look
        self.size = len(node.gpus)
        self.taken = sum(1 for v in self.gpus.values() if v is not None)

    def set_gpu(self, index: int, used: float | None) -> None:
        """What GPU `index` has given out now (None: free), keeping `taken` right."""
        before = self.gpus.get(index)
        self.gpus[index] = used
        self.taken += (used is not None) - (before is not None)


# --- filters that need only the node (cached per pass, per shape of ask) ----------------------


def node_condition(node: NodeView) -> Verdict | None:
    if node.state == "revoked":
        return Verdict(node.name, Reason.REVOKED)
    if node.offline_s is not None:
        return Verdict(node.name, Reason.OFFLINE, used=round(node.offline_s, 1))
    if node.state == "cordoned":
        return Verdict(node.name, Reason.CORDONED)
    if node.max_tasks == 0:
        return Verdict(node.name, Reason.DRAINING, used=len(node.running), capacity=0)
    return None


def check_target(req: Request, node: NodeView) -> Verdict | None:
    if req.target and req.target not in (node.name, node.id):
        return Verdict(node.name, Reason.TARGET, asked=req.target)
    return None


def check_selector(req: Request, node: NodeView) -> Verdict | None:
    for key, want in req.selector:
        have = node.label(key)
        if have is None or (want != "*" and have != want):
            return Verdict(
                node.name, Reason.SELECTOR, asked=f"{key}={want}", capacity=have or "", detail=key
            )
    return None


def matching_gpus(ask: Ask, node: NodeView) -> tuple[Gpu, ...]:
    want = ask.gpu
    return tuple(g for g in node.gpus if want.matches(g.model, g.memory_gb))


def check_gpus(ask: Ask, node: NodeView) -> tuple[Verdict | None, tuple[int, ...]]:
    """The node's GPUs that could ever serve the ask, or why too few could."""
    want = ask.gpu
    if want.count == 0:
        return None, ()
    of_model = [g for g in node.gpus if not want.models or g.model in want.models]
    if not of_model:
        have = ",".join(sorted({g.model for g in node.gpus})) or "none"
        return Verdict(node.name, Reason.GPU_MODEL, asked=want.text(), capacity=have), ()
    fit = [g for g in of_model if want.memory_gb is None or g.memory_gb >= want.memory_gb]
    if want.memory_gb is not None and len(fit) < want.count:
        most = max(g.memory_gb for g in of_model)
        return Verdict(node.name, Reason.GPU_MEMORY, asked=want.memory_gb, capacity=most), ()
    if ask.gpu_share_gb:
        fit = [g for g in fit if g.memory_gb >= ask.gpu_share_gb]
        if len(fit) < want.count:
            most = max(g.memory_gb for g in of_model)
            return Verdict(node.name, Reason.GPU_MEMORY, asked=ask.gpu_share_gb, capacity=most), ()
    if len(fit) < want.count:
        return Verdict(node.name, Reason.GPU_COUNT, asked=want.count, capacity=len(fit)), ()
    return None, tuple(g.index for g in fit)


def check_health(
    ask: Ask, node: NodeView, fit: tuple[int, ...]
) -> tuple[Verdict | None, tuple[int, ...]]:
    """The healthy ones of the GPUs that would serve the ask, or why too few are."""
    sick = {g.index: g for g in node.gpus if not g.healthy}
    if not sick or not fit:
        return None, fit
    healthy = tuple(i for i in fit if i not in sick)
    if len(healthy) < ask.gpu.count:
        first = next(sick[i] for i in fit if i in sick)
        return (
            Verdict(
                node.name,
                Reason.UNHEALTHY,
                asked=ask.gpu.count,
                capacity=len(healthy),
                detail=f"gpu {first.index}: {first.problem or 'unhealthy'}",
            ),
            (),
        )
    return None, healthy


def check_totals(ask: Ask, node: NodeView) -> Verdict | None:
    if node.cpus and ask.cpus > node.cpus:
        return Verdict(node.name, Reason.CPU_TOTAL, asked=ask.cpus, capacity=node.cpus)
    if node.memory_gb and ask.memory_gb > node.memory_gb:
        return Verdict(
            node.name, Reason.MEMORY_TOTAL, asked=ask.memory_gb, capacity=round(node.memory_gb, 1)
        )
    return None


# --- filters of what is free right now ---------------------------------------------------------


def free_gpus(ask: Ask, use: Use, usable: tuple[int, ...]) -> tuple[int, ...] | None:
    """The GPUs the ask gets among `usable`, or None. Whole GPUs: the lowest free indices. A
    reservation: the fullest GPUs it still fits on, so that shared GPUs fill before new ones
    are broken into."""
    count = ask.gpu.count
    if count == 0:
        return ()
    share = ask.gpu_share_gb
    if not share:
        # at most size - taken of the node's GPUs are free (fewer in `usable`): a full node
        # is answered without walking its GPUs, the common case once a pass has filled many
        if use.size - use.taken < count:
            return None
        got = []
        gpus = use.gpus
        for i in usable:
            if gpus.get(i) is None:
                got.append(i)
                if len(got) == count:
                    return tuple(got)
        return None
    return _shared(use, usable, share, count)


def _shared(use: Use, usable: tuple[int, ...], share: float, count: int) -> tuple[int, ...] | None:
    room = []
    for i in usable:
        used = use.gpus.get(i)
        if used == 0.0:
            continue
        total = use.gpu_gb.get(i, 0.0)
        if (used or 0.0) + share <= total:
            room.append((-(used or 0.0), i))
    if len(room) < count:
        return None
    return tuple(sorted(i for _, i in sorted(room)[:count]))


def fits_now(
    ask: Ask, req: Request, node: NodeView, use: Use, usable: tuple[int, ...]
) -> tuple[int, ...] | None:
    """The GPUs the ask gets on the node right now, or None: check_free without saying why
    (the scheduler's inner loop; the why is made only for a run that waits)."""
    if (use.reserved_for is not None and use.reserved_for != req.run_id) or (
        use.tasks >= node.max_tasks
    ):
        return None
    got = free_gpus(ask, use, usable) if ask.gpu.count else ()
    if got is None:
        return None
    if node.cpus and use.cpus + ask.cpus > node.cpus:
        return None
    if node.memory_gb and use.memory_gb + ask.memory_gb > node.memory_gb:
        return None
    if ask.disk_gb and node.disk_free_gb < ask.disk_gb:
        return None
    return got


def busy_reason(
    ask: Ask, req: Request, node: NodeView, use: Use, usable: tuple[int, ...]
) -> str | None:
    """check_free's reason alone, as its value (None: it fits), in the same order, without the
    figures: the scheduler counts reasons over every node for a run that waits, and needs the
    figures only of the few nodes a decision describes in full. The values are module
    constants: a member's lookup on its enum class is a Python call (3.11), once per node."""
    if use.reserved_for is not None and use.reserved_for != req.run_id:
        return _RESERVED
    if use.tasks >= node.max_tasks:
        return _SLOTS
    count = ask.gpu.count
    # fewer GPUs free than it asks for whole: free_gpus's own quick "no", without the call
    if count and (
        (not ask.gpu_share_gb and use.size - use.taken < count)
        or free_gpus(ask, use, usable) is None
    ):
        return _GPUS_BUSY
    if node.cpus and use.cpus + ask.cpus > node.cpus:
        return _CPUS_BUSY
    if node.memory_gb and use.memory_gb + ask.memory_gb > node.memory_gb:
        return _MEMORY_BUSY
    if ask.disk_gb and node.disk_free_gb < ask.disk_gb:
        return _DISK
    return None


_RESERVED, _SLOTS, _GPUS_BUSY = Reason.RESERVED.value, Reason.SLOTS.value, Reason.GPUS_BUSY.value
_CPUS_BUSY, _MEMORY_BUSY, _DISK = (
    Reason.CPUS_BUSY.value,
    Reason.MEMORY_BUSY.value,
    Reason.DISK.value,
)


def check_free(
    ask: Ask, req: Request, node: NodeView, use: Use, usable: tuple[int, ...]
) -> tuple[Verdict | None, tuple[int, ...]]:
    got = fits_now(ask, req, node, use, usable)
    if got is not None:
        return None, got
    if use.reserved_for is not None and use.reserved_for != req.run_id:
        return Verdict(node.name, Reason.RESERVED, detail=use.reserved_for), ()
    if use.tasks >= node.max_tasks:
        return Verdict(node.name, Reason.SLOTS, used=use.tasks, capacity=node.max_tasks), ()
    got = free_gpus(ask, use, usable)
    if got is None:
        busy = sum(1 for i in usable if use.gpus.get(i) is not None)
        return (
            Verdict(
                node.name, Reason.GPUS_BUSY, asked=ask.gpu.count, used=busy, capacity=len(usable)
            ),
            (),
        )
    if node.cpus and use.cpus + ask.cpus > node.cpus:
        return (
            Verdict(node.name, Reason.CPUS_BUSY, asked=ask.cpus, used=use.cpus, capacity=node.cpus),
            (),
        )
    if node.memory_gb and use.memory_gb + ask.memory_gb > node.memory_gb:
        return (
            Verdict(
                node.name,
                Reason.MEMORY_BUSY,
                asked=ask.memory_gb,
                used=round(use.memory_gb, 1),
                capacity=round(node.memory_gb, 1),
            ),
            (),
        )
    if ask.disk_gb and node.disk_free_gb < ask.disk_gb:
        return (
            Verdict(
                node.name, Reason.DISK, asked=ask.disk_gb, capacity=round(node.disk_free_gb, 1)
            ),
            (),
        )
    return None, got


Filter = Callable[[Ask, Request, NodeView], "Verdict | None"]
