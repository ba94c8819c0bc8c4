"""Which alert conditions hold now, from what the store says of the fleet and the runs. Pure:
each with the objects it concerns, what is wrong in one line, and what to do about it."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from orbit.model.alerts import AlertsConfig, Firing
from orbit.model.auth import say_duration
from orbit.model.nodes import NodeRecord, NodeState


def node_alerts(nodes: Iterable[NodeRecord], now: datetime, offline_s: float) -> list[Firing]:
    """A node gone silent (not one revoked or never seen), and each GPU whose health NVML
    gave up on (an XID, ECC errors, fallen off the bus)."""
    found = []
    for node in nodes:
        if node.state is NodeState.REVOKED or node.last_seen_at is None:
            continue
        ago = node.seen_ago(now) or 0.0
        if not node.online(now, offline_s):
            running = f"; {len(node.running)} attempt(s) on it" if node.running else ""
            found.append(
                Firing(
                    key=f"node-offline:{node.name}",
                    kind="node_offline",
                    severity="critical",
                    objects={"node": node.name},
                    message=f"{node.name}: no word for {say_duration(ago)} (offline after "
                    f"{say_duration(offline_s)}){running}",
                    remedy=f"check its agent and network (systemctl status orbit-agent on "
                    f"{node.name}); what ran there is retried elsewhere once it is given up on; "
                    f"to stop placing work there: orbit nodes drain {node.name}",
                )
            )
            continue
        for gpu in _accelerators(node.info):
            if gpu.get("healthy", True):
                continue
            index = gpu.get("index", "?")
            why = str(gpu.get("problem") or "unhealthy")
            found.append(
                Firing(
                    key=f"gpu-unhealthy:{node.name}:{index}",
                    kind="gpu_unhealthy",
                    severity="critical",
                    objects={"node": node.name, "gpu": str(index)},
                    message=f"{node.name} GPU {index}: {why}",
                    remedy=f"drain: orbit nodes drain {node.name}; runs on it will be retried "
                    "elsewhere (the GPU gets no new work until the node reports it healthy)",
                )
            )
    return found


def _accelerators(info: dict[str, Any]) -> list[dict[str, Any]]:
    found = info.get("accelerators") or []  # orbit.wire.protocol.Accelerator, as JSON
    return [g for g in found if isinstance(g, dict)]


def run_alerts(
    waiting: Iterable[tuple[str, str, datetime]],
    retried: Iterable[tuple[str, str, int]],
    now: datetime,
    config: AlertsConfig,
) -> list[Firing]:
    """A run waiting to be placed longer than `run_waiting_s` ((run, user, since)), and one
    still going on more attempts than `retries_over` ((run, user, attempts))."""
    found = []
    for run, user, since in waiting:
        waited = (now - since).total_seconds()
        if waited < config.run_waiting_s:
            continue
        found.append(
            Firing(
                key=f"run-waiting:{run}",
                kind="run_waiting",
                severity="warning",
                objects={"run": run, "user": user},
                message=f"{run} of {user} has waited {say_duration(waited)} to be placed",
                remedy=f"see why: orbit explain {run} (a node that fits, a quota, a dependency)",
            )
        )
    for run, user, attempts in retried:
        if attempts <= config.retries_over:
            continue
        found.append(
            Firing(
                key=f"run-retried:{run}",
                kind="run_retried",
                severity="warning",
                objects={"run": run, "user": user},
                message=f"{run} of {user} is on attempt {attempts} (over {config.retries_over})",
                remedy=f"see what failed: orbit inspect {run}; stop it: orbit cancel {run}",
            )
        )
    return found
