"""Placement on pool nodes as the scheduler sees a node record (orbit.scheduler.node_views, then
orbit.scheduler.ordering): which GPUs an attempt gets, whole or shared by memory reservations,
and why a node is passed over."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from orbit.model.nodes import NodeRecord, NodeState
from orbit.scheduler.model import Ask, Request, SchedConfig, Snapshot
from orbit.scheduler.node_views import node_view
from orbit.scheduler.ordering import schedule
from orbit.scheduler.resources import parse_gpu

NOW = datetime(2026, 1, 1, tzinfo=UTC)
H100 = {"model": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}  # 79.6 GB


def node(
    gpus: int = 2, in_use: dict[int, float] | None = None, model: dict[str, object] = H100
) -> NodeRecord:
    return NodeRecord(
        id="n1",
        name="gpu-a",
        labels={},
        info={"accelerators": [{"index": i, **model} for i in range(gpus)]},
        state=NodeState.ACTIVE,
        max_tasks=8,
        created_at=NOW,
        created_by="tests",
        last_seen_at=NOW,
        gpus_in_use=in_use or {},
    )


def decide(record: NodeRecord, gpu: str | int, share: float = 0.0) -> dict[str, Any]:
    view = node_view(record, NOW, ())
    ask = Ask(gpu=parse_gpu(gpu), gpu_share_gb=share)
    run = Request(run_id="r", attempt_id="a", alternatives=(ask,), submitted_at=0.0)
    plan = schedule(Snapshot("v", NOW.timestamp(), (view,)), [run], SchedConfig())
    return plan.decisions["r"]


def gpus(record: NodeRecord, gpu: str | int, share: float = 0.0) -> list[int] | None:
    chosen = decide(record, gpu, share)["chosen"]
    return None if chosen is None else list(chosen["nodes"][0]["gpus"])


def test_whole_gpus_are_those_nobody_uses() -> None:
    assert gpus(node(), 1) == [0]
    assert gpus(node(in_use={0: 0.0}), 1) == [1]
    assert gpus(node(in_use={0: 20.0}), 1) == [1]  # a shared GPU is not free
    assert gpus(node(in_use={0: 0.0, 1: 20.0}), 1) is None
    assert gpus(node(), 2) == [0, 1]
    assert gpus(node(), 0) == []


def test_reservations_share_a_gpu_while_they_fit_and_never_a_whole_one() -> None:
    assert gpus(node(in_use={0: 30.0}), 1, share=30) == [0]  # 60 of 79.6 GB
    assert gpus(node(in_use={0: 50.0}), 1, share=30) == [1]  # 80 would not fit on GPU 0
    assert gpus(node(in_use={0: 0.0}), 1, share=10) == [1]  # never onto a whole one
    assert gpus(node(in_use={0: 50.0, 1: 0.0}), 1, share=30) is None


def test_the_model_is_the_catalogs_from_nvmls_name() -> None:
    assert gpus(node(), "H100") == [0]
    assert gpus(node(), "H100-80GB:2") == [0, 1]
    assert gpus(node(), "A100") is None


def test_the_reason_says_whether_the_node_ever_can() -> None:
    def why(record: NodeRecord, gpu: str | int, share: float = 0.0) -> dict[str, Any]:
        record_ = decide(record, gpu, share)
        assert record_["outcome"] == "waiting"
        verdict: dict[str, Any] = record_["alternatives"][0]["nodes"][0]
        return verdict

    assert why(node(), 3) == {"node": "gpu-a", "reason": "gpu_count", "asked": 3, "capacity": 2}
    assert why(node(gpus=0), 1)["reason"] == "gpu_model"  # no GPU at all
    assert why(node(), "A100")["capacity"] == "H100-80GB"
    assert why(node(), 1, share=100) == {
        "node": "gpu-a",
        "reason": "gpu_memory",
        "asked": 100.0,
        "capacity": 79.6,
    }
    assert why(node(in_use={0: 0.0, 1: 0.0}), 1) == {
        "node": "gpu-a",
        "reason": "gpus_busy",
        "asked": 1,
        "used": 2,
        "capacity": 2,
    }
