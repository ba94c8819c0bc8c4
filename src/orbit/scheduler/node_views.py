"""From node records (and registered SSH hosts) to the scheduler's snapshot: each node as a
NodeView with the attempts running there, and the snapshot's version (a digest of them)."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from datetime import datetime
from typing import Any

from orbit.model.hosts import HostRecord
from orbit.model.nodes import SERVICE_LABEL, NodeRecord, NodeState
from orbit.model.stored import read_json
from orbit.scheduler.codec import dumps, node_out
from orbit.scheduler.model import Gpu, NodeView, Running, SchedConfig, Snapshot
from orbit.scheduler.request_views import asks_of, epoch_of, running_of
from orbit.scheduler.resources import canonical_model


def _service_labels(info: dict[str, Any]) -> dict[str, str]:
    """A label per model server the node advertises, for `http` tasks that ask for one."""
    services = info.get("services") or {}
    return {f"{SERVICE_LABEL}{name}": "yes" for name in services if isinstance(name, str)}


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
        preempted_at=epoch_of(node.preempted_at) if node.preempted_at else None,
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
            if not run.gpus and not read_json(row["node_gpus"]):
                want = asks_of(row["request"].resources)
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
