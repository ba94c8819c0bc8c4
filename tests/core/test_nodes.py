"""Placement on pool nodes (orbit.core.nodes): which GPUs an attempt gets, whole or shared by
memory reservations, and why a node is passed over."""

from __future__ import annotations

from datetime import UTC, datetime

from orbit.core.nodes import NodeRecord, NodeState, fit_gpus, place

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


def test_whole_gpus_are_those_nobody_uses() -> None:
    assert fit_gpus(node(), 1, 0, None) == (0,)
    assert fit_gpus(node(in_use={0: 0.0}), 1, 0, None) == (1,)
    assert fit_gpus(node(in_use={0: 20.0}), 1, 0, None) == (1,)  # a shared GPU is not free
    assert fit_gpus(node(in_use={0: 0.0, 1: 20.0}), 1, 0, None) is None
    assert fit_gpus(node(), 2, 0, None) == (0, 1)
    assert fit_gpus(node(), 0, 0, None) == ()


def test_reservations_share_a_gpu_while_they_fit_and_never_a_whole_one() -> None:
    assert fit_gpus(node(in_use={0: 30.0}), 1, 30, None) == (0,)  # 60 of 79.6 GB
    assert fit_gpus(node(in_use={0: 60.0}), 1, 30, None) == (1,)  # 90 would not fit
    assert fit_gpus(node(in_use={0: 0.0}), 1, 10, None) == (1,)  # GPU 0 is someone's whole
    assert fit_gpus(node(in_use={0: 60.0, 1: 0.0}), 1, 30, None) is None


def test_gpu_type_picks_by_model_name() -> None:
    assert fit_gpus(node(), 1, 0, "h100") == (0,)
    assert fit_gpus(node(), 1, 0, "A100") is None


def test_the_reason_says_whether_the_node_ever_can() -> None:
    def why(n: NodeRecord, count: int, memory: float = 0, kind: str | None = None) -> str:
        fit, reasons = place([n], NOW, {}, count, memory, kind)
        assert fit is None
        return reasons["gpu-a"]

    assert why(node(), 3) == "has 2 GPUs, 3 asked"
    assert why(node(gpus=0), 1) == "has 0 GPUs, 1 asked"
    assert why(node(), 1, kind="A100") == "has 0 A100 GPUs, 1 asked"
    assert why(node(), 1, memory=100) == "has 0 GPUs of 100 GB or more, 1 asked"
    assert why(node(in_use={0: 0.0, 1: 0.0}), 1) == "not enough free GPUs"
    fit, reasons = place([node(in_use={0: 0.0})], NOW, {}, 1)
    assert fit is not None and fit.gpu_indices == (1,) and reasons == {}
