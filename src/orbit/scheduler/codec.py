"""The scheduler's inputs as JSON and back: a pass's snapshot and queue are stored beside its
decisions, so that `orbit explain --replay` and `orbit sched simulate` run the same pass
again. Written with sorted keys and no spaces, so that equal inputs are equal bytes."""

from __future__ import annotations

import json
from typing import Any

from orbit.scheduler.model import Ask, Gpu, NodeView, Request, Running, Snapshot
from orbit.scheduler.resources import GpuAsk

# json.dumps with these arguments makes a new encoder on every call; one, made once, writes
# the same bytes (a pass writes thousands of decisions)
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def dumps(value: Any) -> bytes:
    return _CANONICAL.encode(value).encode()


def ask_out(ask: Ask) -> dict[str, Any]:
    return {
        "gpu": {
            "models": list(ask.gpu.models),
            "memory_gb": ask.gpu.memory_gb,
            "count": ask.gpu.count,
        },
        "gpu_share_gb": ask.gpu_share_gb,
        "cpus": ask.cpus,
        "memory_gb": ask.memory_gb,
        "disk_gb": ask.disk_gb,
    }


def ask_in(d: dict[str, Any]) -> Ask:
    g = d["gpu"]
    return Ask(
        gpu=GpuAsk(tuple(g["models"]), g["memory_gb"], g["count"]),
        gpu_share_gb=d["gpu_share_gb"],
        cpus=d["cpus"],
        memory_gb=d["memory_gb"],
        disk_gb=d["disk_gb"],
    )


def request_out(r: Request) -> dict[str, Any]:
    return {
        "run_id": r.run_id,
        "attempt_id": r.attempt_id,
        "alternatives": [ask_out(a) for a in r.alternatives],
        "submitted_at": r.submitted_at,
        "tier": r.tier,
        "preemptible": r.preemptible,
        "selector": [list(p) for p in r.selector],
        "target": r.target,
        "num_nodes": r.num_nodes,
        "user": r.user,
        "experiment": r.experiment,
        "cache_keys": list(r.cache_keys),
        "max_runtime_s": r.max_runtime_s,
    }


def request_in(d: dict[str, Any]) -> Request:
    return Request(
        **{
            **d,
            "alternatives": tuple(ask_in(a) for a in d["alternatives"]),
            "selector": tuple((k, v) for k, v in d["selector"]),
            "cache_keys": tuple(d["cache_keys"]),
        }
    )


def _running_out(r: Running) -> dict[str, Any]:
    return {
        "attempt_id": r.attempt_id,
        "run_id": r.run_id,
        "tier": r.tier,
        "preemptible": r.preemptible,
        "gpus": list(r.gpus),
        "gpu_share_gb": r.gpu_share_gb,
        "cpus": r.cpus,
        "memory_gb": r.memory_gb,
        "user": r.user,
        "experiment": r.experiment,
        "started_at": r.started_at,
        "ends_by": r.ends_by,
        "preempted_by": r.preempted_by,
    }


def node_out(n: NodeView) -> dict[str, Any]:
    return {
        "id": n.id,
        "name": n.name,
        "labels": [list(p) for p in n.labels],
        "state": n.state,
        "offline_s": n.offline_s,
        "max_tasks": n.max_tasks,
        "gpus": [
            {
                "index": g.index,
                "model": g.model,
                "memory_gb": g.memory_gb,
                "used_gb": g.used_gb,
                "healthy": g.healthy,
                "problem": g.problem,
            }
            for g in n.gpus
        ],
        "cpus": n.cpus,
        "memory_gb": n.memory_gb,
        "disk_free_gb": n.disk_free_gb,
        "running": [_running_out(r) for r in n.running],
        "cached": sorted(n.cached),
        "kind": n.kind,
        "preempted_at": n.preempted_at,
    }


def node_in(d: dict[str, Any]) -> NodeView:
    return NodeView(
        **{
            **d,
            "labels": tuple((k, v) for k, v in d["labels"]),
            "gpus": tuple(Gpu(**g) for g in d["gpus"]),
            "running": tuple(Running(**{**r, "gpus": tuple(r["gpus"])}) for r in d["running"]),
            "cached": frozenset(d["cached"]),
        }
    )


def pass_out(snapshot: Snapshot, queue: list[Request]) -> dict[str, Any]:
    return {
        "version": snapshot.version,
        "at": snapshot.at,
        "nodes": [node_out(n) for n in snapshot.nodes],
        "queue": [request_out(r) for r in queue],
    }


def pass_in(d: dict[str, Any]) -> tuple[Snapshot, list[Request]]:
    snapshot = Snapshot(
        version=d["version"], at=d["at"], nodes=tuple(node_in(n) for n in d["nodes"])
    )
    return snapshot, [request_in(r) for r in d["queue"]]
