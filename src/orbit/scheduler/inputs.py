"""From what the store keeps to what the scheduler reads: node records to NodeViews, a run's
request to its ordered alternatives, an attempt waiting or running to a Request or a
Running. Also the check made at submit: a request no node could ever serve is refused."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from datetime import datetime
from typing import Any

from orbit.core.errors import InvalidInput
from orbit.core.hosts import HostRecord
from orbit.core.models import ExecutionRequest, ResourceAlternative, Resources
from orbit.core.nodes import SERVICE_LABEL, NodeRecord, NodeState
from orbit.scheduler.codec import dumps, node_out
from orbit.scheduler.model import Ask, Gpu, NodeView, Request, Running, SchedConfig, Snapshot
from orbit.scheduler.resources import GpuAsk, canonical_model, parse_gpu


def _gpu_ask(gpu: str | int | None, gpu_type: str | None, gpu_count: int, field: str) -> GpuAsk:
    if gpu is not None:
        return parse_gpu(gpu, f"{field}.gpu")
    if not gpu_count:
        return GpuAsk(count=0)
    models = parse_gpu(gpu_type, f"{field}.gpu_type").models if gpu_type else ()
    return GpuAsk(models=models, count=gpu_count)


def asks_of(resources: Resources, field: str = "resources") -> tuple[Ask, ...]:
    """A request's alternatives, in order: `any_of`'s (each taking what it leaves out from
    the resources around it), or the resources themselves."""
    base = Ask(
        gpu=_gpu_ask(resources.gpu, resources.gpu_type, resources.gpu_count, field),
        gpu_share_gb=float(resources.gpu_memory_gb or 0.0),
        cpus=float(resources.cpu_count),
        memory_gb=float(resources.memory_gb),
        disk_gb=float(resources.disk_gb or 0.0),
    )
    if not resources.any_of:
        return (base,)
    return tuple(
        _alternative(base, alt, f"{field}.any_of[{n}]") for n, alt in enumerate(resources.any_of)
    )


def _alternative(base: Ask, alt: ResourceAlternative, field: str) -> Ask:
    gpu = base.gpu
    if alt.gpu is not None or alt.gpu_count is not None or alt.gpu_type is not None:
        count = alt.gpu_count if alt.gpu_count is not None else (1 if alt.gpu_type else 0)
        gpu = _gpu_ask(alt.gpu, alt.gpu_type, count, field)
    return Ask(
        gpu=gpu,
        gpu_share_gb=float(
            alt.gpu_memory_gb if alt.gpu_memory_gb is not None else base.gpu_share_gb
        ),
        cpus=float(alt.cpu_count if alt.cpu_count is not None else base.cpus),
        memory_gb=float(alt.memory_gb if alt.memory_gb is not None else base.memory_gb),
        disk_gb=float(alt.disk_gb if alt.disk_gb is not None else base.disk_gb),
    )


OVERFLOW_KINDS = ("ssh", "targon_rental")  # where a pool run may overflow: registered SSH hosts


def overflow_of(request: ExecutionRequest) -> tuple[str, ...]:
    """The placements a pool run may overflow to when the pool cannot take it now (the
    template's placement.overflow), () for none."""
    raw = getattr(request.placement, "overflow", None) or ()
    if (
        isinstance(raw, str)
        or not isinstance(raw, list | tuple)
        or not all(isinstance(k, str) and k in OVERFLOW_KINDS for k in raw)
    ):
        raise InvalidInput(
            f"template '{request.template_id}': placement.overflow: expected a list of "
            f"placement kinds from {', '.join(OVERFLOW_KINDS)} (registered SSH hosts), "
            f"got {raw!r}"
        )
    return tuple(raw)


def selector_of(request: ExecutionRequest) -> dict[str, str]:
    """The template's placement.selector with the request's own selector laid over it."""
    raw = getattr(request.placement, "selector", None) or {}
    if not isinstance(raw, dict):
        raise InvalidInput(
            f"template '{request.template_id}': placement.selector: expected a mapping of "
            "label -> value"
        )
    return {**{str(k): str(v) for k, v in raw.items()}, **request.selector}


def tier_of(request: ExecutionRequest, config: SchedConfig) -> int:
    rank = config.tier_rank(request.priority)
    if rank is None:
        raise InvalidInput(
            f"priority: unknown tier '{request.priority}' (known: {', '.join(config.tiers)})"
        )
    return rank


def check_request(request: ExecutionRequest, config: SchedConfig) -> tuple[Ask, ...]:
    """Everything about a request the scheduler can refuse before it is queued: its
    alternatives, its tier. Returns the alternatives."""
    asks = asks_of(request.resources)
    tier_of(request, config)
    selector_of(request)
    if request.num_nodes > 1 and request.target not in (None, "", "pool"):
        raise InvalidInput(
            f"num_nodes: {request.num_nodes} nodes cannot all be target '{request.target}' "
            "(pin one node with target, or choose several with selector)"
        )
    return asks


def _epoch(value: datetime | None) -> float:
    return value.timestamp() if value is not None else 0.0


def _no_node_has(
    selector: tuple[tuple[str, str], ...], views: tuple[NodeView, ...], service_field: str
) -> str:
    """The refusal of a request whose labels no node has together: a model server no node
    advertises is named as such, by the task's field that asked for it."""
    has = {pair for v in views for pair in v.labels}
    missing = [(k, v) for k, v in selector if (k, v) not in has]
    services = [k.removeprefix(SERVICE_LABEL) for k, _ in missing if k.startswith(SERVICE_LABEL)]
    if services and len(services) == len(missing):
        names = ", ".join(services)
        return (
            f"{service_field}: no registered node advertises {names} (a node does with "
            f"`orbit agent --service {services[0]}=URL`)"
        )
    wanted = ", ".join(f"{k}={v}" for k, v in (missing or selector))
    together = "" if missing else " together"
    return f"selector: no registered node has the labels {wanted}{together}"


def _service_labels(info: dict[str, Any]) -> dict[str, str]:
    """A label per model server the node advertises, for `http` tasks that ask for one."""
    services = info.get("services") or {}
    return {f"{SERVICE_LABEL}{name}": "yes" for name in services if isinstance(name, str)}


def _cache_keys(submission: dict[str, Any]) -> tuple[str, ...]:
    task = submission.get("task_request") or {}
    keys = [task.get(k) for k in ("model", "model_id", "dataset")]
    return tuple(k for k in keys if isinstance(k, str) and k)


def request_of(row: dict[str, Any], config: SchedConfig) -> Request:
    """A waiting attempt (a store row with its run's request) as the scheduler reads it. A
    request that no longer reads (an unknown tier after a config change) is queued as the
    least urgent tier rather than dropped."""
    request = ExecutionRequest.model_validate(_json(row["request"]))
    submission = _json(row["submission"]) or {}
    try:
        asks = asks_of(request.resources)
    except InvalidInput:
        asks = (Ask(),)
    rank = config.tier_rank(request.priority)
    return Request(
        run_id=row["run_id"],
        attempt_id=row["id"],
        alternatives=asks,
        submitted_at=_epoch(_time(row["run_created_at"])),
        tier=len(config.tiers) - 1 if rank is None else rank,
        preemptible=request.preemptible,
        selector=tuple(sorted(selector_of(request).items())),
        target=request.target if request.target not in (None, "", "pool") else None,
        num_nodes=request.num_nodes,
        user=row["created_by"],
        experiment=row["experiment"],
        cache_keys=_cache_keys(submission),
        max_runtime_s=request.max_runtime_s,
    )


ETA_ROUND_S = 60.0  # an end from progress moves a little every pass: kept to the minute


def eta_from_progress(
    step: int | None, max_steps: int | None, started: datetime | None, at: datetime
) -> float | None:
    """When a running attempt will likely end, from how far along it is (its logging.jsonl's
    step of max_steps) at the pace it has kept since it started, to the minute above; None
    where it says no step or no total."""
    if not step or not max_steps or started is None or step <= 0 or max_steps < step:
        return None
    elapsed = max(0.0, (at - started).total_seconds())
    end = at.timestamp() + elapsed * (max_steps - step) / step
    return -(-end // ETA_ROUND_S) * ETA_ROUND_S


def running_of(row: dict[str, Any], config: SchedConfig, eta: float | None = None) -> Running:
    """`eta`: when its progress says it will end (eta_from_progress); the end the scheduler
    counts on is the earlier of that and its max_runtime's."""
    request = ExecutionRequest.model_validate(_json(row["request"]))
    placed = _json(row["node_gpus"]) or {}
    rank = config.tier_rank(request.priority)
    started = _time(row["started_at"]) or _time(row["created_at"])
    ends_by = _epoch(started) + request.max_runtime_s if started and request.max_runtime_s else None
    if eta is not None:
        ends_by = eta if ends_by is None else min(ends_by, eta)
    res = request.resources
    return Running(
        attempt_id=row["id"],
        run_id=row["run_id"],
        tier=len(config.tiers) - 1 if rank is None else rank,
        # a gang's ranks are not victims: the pass weighs one node's work at a time, and
        # stopping one rank stops the gang on every node
        preemptible=request.preemptible and request.num_nodes == 1,
        gpus=tuple(int(i) for i in placed.get("indices", ())),
        gpu_share_gb=float(placed.get("memory_gb", 0.0) or 0.0),
        cpus=float(placed.get("cpus", res.cpu_count if not res.any_of else 0)),
        memory_gb=float(placed.get("memory_gb_ram", res.memory_gb if not res.any_of else 0)),
        user=row["created_by"],
        experiment=row["experiment"],
        started_at=_epoch(started),
        ends_by=ends_by,
        preempted_by=row["preempted_by"],
    )


def node_view(
    node: NodeRecord,
    at: datetime,
    running: tuple[Running, ...],
    offline_after_s: float | None = None,
) -> NodeView:
    """`offline_after_s`: the control plane's own (a record read from the store carries the
    default)."""
    info = node.info
    gpus = []
    for acc in info.get("accelerators", ()):
        mib = float(acc.get("memory_mb", 0))
        raw = str(acc.get("model", ""))
        index = int(acc.get("index", -1))
        gpus.append(
            Gpu(
                index=index,
                model=canonical_model(raw, mib) or raw,
                memory_gb=round(mib / 1024, 1),
                used_gb=node.gpus_in_use.get(index),
                healthy=bool(acc.get("healthy", True)),
                problem=str(acc.get("problem", "")),
            )
        )
    known = {(g.model, g.memory_gb) for g in gpus if g.model}
    if len(known) == 1:  # a GPU off the bus tells no name: its siblings' is the likely one
        model, memory = known.pop()
        gpus = [g if g.model else replace(g, model=model, memory_gb=memory) for g in gpus]
    online = node.online(at, offline_after_s)
    ago = node.seen_ago(at)
    cached = {*info.get("cached_models", ()), *info.get("cached_datasets", ())}
    return NodeView(
        id=node.id,
        name=node.name,
        labels=tuple(sorted({**node.labels, **_service_labels(info)}.items())),
        state="revoked" if node.state is NodeState.REVOKED else str(node.state),
        offline_s=None if online else (ago if ago is not None else -1.0),
        max_tasks=node.max_tasks,
        gpus=tuple(gpus),
        cpus=float(info.get("cpus", 0)),
        memory_gb=round(float(info.get("memory_mb", 0)) / 1024, 1),
        disk_free_gb=round(float(info.get("disk_free_mb", 0)) / 1024, 1),
        running=running,
        cached=frozenset(str(c) for c in cached),
        preempted_at=_epoch(node.preempted_at) if node.preempted_at else None,
    )


def snapshot_of(
    nodes: list[NodeRecord],
    placed: list[dict[str, Any]],
    at: datetime,
    config: SchedConfig,
    offline_after_s: float | None = None,
    etas: dict[str, float] | None = None,
) -> Snapshot:
    """`etas`: attempt id -> when its progress says it will end (eta_from_progress)."""
    by_node: dict[str, list[Running]] = {}
    for row in placed:
        eta = (etas or {}).get(row["id"])
        by_node.setdefault(row["node_id"], []).append(running_of(row, config, eta))
    views = tuple(node_view(n, at, tuple(by_node.get(n.id, ())), offline_after_s) for n in nodes)
    digest = hashlib.sha256(dumps([node_out(v) for v in views])).hexdigest()[:12]
    return Snapshot(version=digest, at=round(at.timestamp(), 3), nodes=views)


HOST_PREFIX = "host/"  # a registered SSH host's node id in a snapshot: host/NAME


def hosts_snapshot(
    hosts: list[HostRecord],
    on_hosts: list[dict[str, Any]],
    at: datetime,
    config: SchedConfig,
    pool: tuple[NodeView, ...] = (),
) -> Snapshot:
    """Registered SSH hosts as nodes (kind ssh), for runs that overflow onto them: what each
    has by its last `orbit hosts check` (a host never checked offers nothing), a slot per GPU
    (one without GPUs: one slot), and the attempts on it that have not ended holding their
    share. An attempt sent there directly says how many GPUs, not which: it is given the
    lowest free ones. The `pool`'s nodes come too, cordoned: nothing goes there in this
    pass, but what runs on them counts towards quotas and fair share."""
    by_host: dict[str, list[dict[str, Any]]] = {}
    for row in on_hosts:
        by_host.setdefault(str(row["target"]), []).append(row)
    views = []
    for host in hosts:
        facts = host.facts
        if facts is None:
            continue
        gpus = [
            Gpu(
                index=g.index,
                model=canonical_model(g.name, float(g.memory_mib or 0)) or g.name,
                memory_gb=round(float(g.memory_mib or 0) / 1024, 1),
            )
            for g in facts.gpus
        ]
        running = []
        taken: set[int] = set()
        for row in by_host.get(host.name, ()):
            run = running_of(row, config)
            if not run.gpus and not _json(row["node_gpus"]):
                want = asks_of(ExecutionRequest.model_validate(_json(row["request"])).resources)
                free = [g.index for g in gpus if g.index not in taken]
                run = replace(run, gpus=tuple(free[: want[0].gpu.count]))
            taken.update(run.gpus)
            running.append(run)
        used = {i: 0.0 for i in taken}
        views.append(
            NodeView(
                id=HOST_PREFIX + host.name,
                name=host.name,
                labels=(),
                state="active",
                offline_s=None,
                max_tasks=max(1, len(gpus)),
                gpus=tuple(replace(g, used_gb=used.get(g.index)) for g in gpus),
                disk_free_gb=round((facts.disk_free_bytes or 0) / 1024**3, 1),
                running=tuple(running),
                kind="ssh",
            )
        )
    if views:
        views += [replace(v, state="cordoned") for v in pool]
    digest = hashlib.sha256(dumps([node_out(v) for v in views])).hexdigest()[:12]
    return Snapshot(version=digest, at=round(at.timestamp(), 3), nodes=tuple(views))


def _json(value: Any) -> Any:
    from orbit.store.sql import read_json

    return read_json(value)


def _time(value: Any) -> datetime | None:
    from orbit.store.sql import read_time

    return read_time(value)


def never_fits(
    request: ExecutionRequest,
    nodes: list[NodeRecord],
    at: datetime,
    config: SchedConfig,
    service_field: str = "task.service",
) -> str | None:
    """Why no registered node could ever hold any of the request's alternatives, whatever
    runs there, whether it is online now and whether its GPUs are healthy now (a GPU is reset,
    a node comes back); None if one could."""
    from orbit.scheduler.plan import Pass

    def ever(view: NodeView) -> NodeView:
        gpus = tuple(replace(g, healthy=True, problem="") for g in view.gpus)
        return replace(view, state="active", offline_s=None, max_tasks=1, gpus=gpus)

    views = tuple(ever(node_view(n, at, ())) for n in nodes)
    probe = Request(
        run_id="",
        attempt_id="",
        alternatives=asks_of(request.resources),
        submitted_at=0.0,
        selector=tuple(sorted(selector_of(request).items())),
        target=request.target if request.target not in (None, "", "pool") else None,
    )
    checker = Pass(Snapshot("submit", at.timestamp(), views), config)
    most = max(len(checker.shape(ask, probe).candidates) for ask in probe.alternatives)
    if most >= request.num_nodes:
        return None
    if most:  # some node could, but fewer than the gang needs
        return (
            f"num_nodes: {request.num_nodes} nodes asked for at once, but only {most} "
            f"registered node(s) could ever hold {'; '.join(a.text() for a in probe.alternatives)}"
        )
    largest = max(views, key=lambda v: (len(v.gpus), v.cpus, v.memory_gb, v.name))
    models = sorted({g.model for g in largest.gpus})
    has = f"{len(largest.gpus)} GPU(s)" + (f" ({', '.join(models)})" if models else "")
    field = "resources.any_of" if len(probe.alternatives) > 1 else "resources"
    asked = "; ".join(a.text() for a in probe.alternatives)
    if probe.target:
        field = "target"
    elif probe.selector and not any(
        checker.shape(ask, replace(probe, selector=())).candidates for ask in probe.alternatives
    ):
        pass
    elif probe.selector:
        return _no_node_has(probe.selector, views, service_field)
    return (
        f"{field}: no registered node could ever hold {asked}; the largest, {largest.name}, has "
        f"{has}, {largest.cpus:g} CPUs, {largest.memory_gb:g} GB RAM"
    )
