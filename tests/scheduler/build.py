"""Small builders for the scheduler's pure tests: nodes, runs and configs in a line each."""

from __future__ import annotations

from orbit.scheduler.model import Ask, Gpu, NodeView, Request, Running, SchedConfig, Snapshot
from orbit.scheduler.ordering import schedule
from orbit.scheduler.plan import Plan
from orbit.scheduler.resources import parse_gpu

NOW = 1_800_000_000.0


def node(
    name: str,
    gpus: str = "",
    max_tasks: int = 4,
    labels: dict[str, str] | None = None,
    cpus: float = 32,
    memory_gb: float = 256,
    used: dict[int, float] | None = None,
    running: tuple[Running, ...] = (),
    state: str = "active",
    offline_s: float | None = None,
    sick: dict[int, str] | None = None,
    cached: tuple[str, ...] = (),
    preempted_at: float | None = None,
) -> NodeView:
    """`gpus` as `MODEL*COUNT` (memory from the catalog), e.g. "H100-80GB*8"."""
    from orbit.scheduler.resources import MODELS

    views = []
    if gpus:
        model, _, count = gpus.partition("*")
        mem = MODELS[model.upper()].memory_gb
        for i in range(int(count or 1)):
            views.append(
                Gpu(
                    index=i,
                    model=MODELS[model.upper()].name,
                    memory_gb=mem,
                    used_gb=(used or {}).get(i),
                    healthy=i not in (sick or {}),
                    problem=(sick or {}).get(i, ""),
                )
            )
    return NodeView(
        id=f"node-{name}",
        name=name,
        labels=tuple(sorted((labels or {}).items())),
        state=state,
        offline_s=offline_s,
        max_tasks=max_tasks,
        gpus=tuple(views),
        cpus=cpus,
        memory_gb=memory_gb,
        disk_free_gb=500,
        running=running,
        cached=frozenset(cached),
        preempted_at=preempted_at,
    )


def ask(gpu: str | int | None = None, share: float = 0.0, cpus: float = 0, mem: float = 0) -> Ask:
    return Ask(gpu=parse_gpu(gpu), gpu_share_gb=share, cpus=cpus, memory_gb=mem)


def run(
    name: str,
    *alternatives: Ask,
    at: float = 0.0,
    tier: int = 2,
    user: str = "u",
    experiment: str = "e",
    **kw: object,
) -> Request:
    return Request(
        run_id=f"run-{name}",
        attempt_id=f"att-{name}",
        alternatives=alternatives or (ask(),),
        submitted_at=NOW - 100 + at,
        tier=tier,
        user=user,
        experiment=experiment,
        **kw,  # type: ignore[arg-type]
    )


def running(
    name: str,
    gpus: tuple[int, ...],
    tier: int = 3,
    preemptible: bool = True,
    started: float = 0.0,
    user: str = "v",
    preempted_by: str | None = None,
) -> Running:
    return Running(
        attempt_id=f"att-{name}",
        run_id=f"run-{name}",
        tier=tier,
        preemptible=preemptible,
        gpus=gpus,
        gpu_share_gb=0.0,
        cpus=0,
        memory_gb=0,
        user=user,
        experiment="e",
        started_at=NOW - 1000 + started,
        preempted_by=preempted_by,
    )


def plan(nodes: list[NodeView], queue: list[Request], config: SchedConfig | None = None) -> Plan:
    return schedule(
        Snapshot("v1", NOW, tuple(nodes)), queue, config or SchedConfig(preemption=True)
    )


def where(p: Plan) -> dict[str, str]:
    """run name -> node name it was placed on."""
    return {
        pl.run_id.removeprefix("run-"): ",".join(n for _, n, _ in pl.nodes) for pl in p.placements
    }
