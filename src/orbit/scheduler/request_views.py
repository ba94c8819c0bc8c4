"""From a run's request and its attempts' store rows to what the scheduler reads: the
request's ordered alternatives (Asks), a waiting attempt as a Request, a running one as a
Running. Also the checks made at submit of the request alone (its alternatives, its tier)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orbit.model.errors import InvalidInput
from orbit.model.models import ExecutionRequest, ResourceAlternative, Resources, TaskSubmission
from orbit.model.stored import read_json, read_time
from orbit.scheduler.model import Ask, Request, Running, SchedConfig
from orbit.scheduler.resources import GpuAsk, parse_gpu


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


def epoch_of(value: datetime | None) -> float:
    return value.timestamp() if value is not None else 0.0


def _cache_keys(submission: TaskSubmission) -> tuple[str, ...]:
    task = submission.task_request
    keys = [task.get(k) for k in ("model", "model_id", "dataset")]
    return tuple(k for k in keys if isinstance(k, str) and k)


def request_of(row: dict[str, Any], config: SchedConfig) -> Request:
    """A waiting attempt (a store row with its run's request) as the scheduler reads it. A
    request that no longer reads (an unknown tier after a config change) is queued as the
    least urgent tier rather than dropped."""
    request: ExecutionRequest = row["request"]
    submission: TaskSubmission = row["submission"]
    try:
        asks = asks_of(request.resources)
    except InvalidInput:
        asks = (Ask(),)
    rank = config.tier_rank(request.priority)
    return Request(
        run_id=row["run_id"],
        attempt_id=row["id"],
        alternatives=asks,
        submitted_at=epoch_of(_time(row["run_created_at"])),
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
    request: ExecutionRequest = row["request"]
    placed = _json(row["node_gpus"]) or {}
    rank = config.tier_rank(request.priority)
    started = _time(row["started_at"]) or _time(row["created_at"])
    ends_by = (
        epoch_of(started) + request.max_runtime_s if started and request.max_runtime_s else None
    )
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
        started_at=epoch_of(started),
        ends_by=ends_by,
        preempted_by=row["preempted_by"],
    )


def _json(value: Any) -> Any:
    return read_json(value)


def _time(value: Any) -> datetime | None:
    return read_time(value)
