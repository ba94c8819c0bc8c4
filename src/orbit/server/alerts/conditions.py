"""Which alert conditions hold now, from what the store says of the fleet and the runs. Pure:
each with the objects it concerns, what is wrong in one line, and what to do about it."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from orbit.model.alerts import AlertsConfig, Firing
from orbit.model.durations import say_duration
from orbit.model.nodes import NodeRecord, NodeState


def node_alerts(
    nodes: Iterable[NodeRecord], now: datetime, offline_s: float, config: AlertsConfig
) -> list[Firing]:
    """A node gone silent (not one revoked or never seen), one whose work dir's disk is nearly
    full, and each GPU whose health NVML gave up on (an XID, ECC errors, off the bus)."""
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
        free = node.info.get("disk_free_mb")
        if isinstance(free, int) and 0 < free < config.disk_free_mb:  # 0: not measured
            found.append(
                Firing(
                    key=f"disk-low:{node.name}",
                    kind="disk_low",
                    severity="warning",
                    objects={"node": node.name},
                    message=f"{node.name}: {free / 1024:.1f} GiB free in its work dir (under "
                    f"{config.disk_free_mb / 1024:.1f} GiB)",
                    remedy=f"free space: orbit gc (ended runs' files), or orbit nodes drain "
                    f"{node.name} until its disk is cleaned; runs there may fail to write",
                )
            )
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


def stalled_alerts(
    stalled: Iterable[tuple[str, str, int | None, datetime]], now: datetime, config: AlertsConfig
) -> list[Firing]:
    """A running run whose progress ((run, user, step, since when it has not moved)) has not
    moved for `no_progress_s`: a hung job holding its GPUs."""
    found = []
    for run, user, step, since in stalled:
        still = (now - since).total_seconds()
        if still < config.no_progress_s:
            continue
        at = f" at step {step}" if step is not None else ""
        found.append(
            Firing(
                key=f"run-stalled:{run}",
                kind="run_stalled",
                severity="warning",
                objects={"run": run, "user": user},
                message=f"{run} of {user} has logged no progress for {say_duration(still)}{at}",
                remedy=f"look at its last logs: orbit logs {run} --tail 50 (a hang, a deadlock "
                f"in a collective); if it is stuck, free its GPUs: orbit cancel {run}",
            )
        )
    return found


def starvation_alerts(
    waiting: Iterable[tuple[str, str, datetime]],
    held: dict[str, int],
    quotas: dict[str, int],
    now: datetime,
    config: AlertsConfig,
) -> list[Firing]:
    """A user whose runs ((run, user, since)) have waited `starved_s` while they hold fewer
    GPUs than their quota (none when they have none): their share is not reaching them."""
    oldest: dict[str, tuple[datetime, str]] = {}
    for run, user, since in waiting:
        if user not in oldest or since < oldest[user][0]:
            oldest[user] = (since, run)
    found = []
    for user, (since, run) in sorted(oldest.items()):
        waited, has = (now - since).total_seconds(), held.get(user, 0)
        quota = quotas.get(user)
        if waited < config.starved_s or has >= (quota if quota is not None else 1):
            continue
        share = f"{has} of {quota} GPUs (quota)" if quota is not None else "no GPUs"
        found.append(
            Firing(
                key=f"user-starved:{user}",
                kind="user_starved",
                severity="warning",
                objects={"user": user, "run": run},
                message=f"{user}'s runs have waited {say_duration(waited)} while {user} holds "
                f"{share}",
                remedy=f"see what holds the GPUs and why {run} waits: orbit queue; orbit explain "
                f"{run}; give {user} a larger share (orbit quotas set user {user} --gpus N "
                "--weight W) or let preemption act (orbit sched config show)",
            )
        )
    return found


def audit_alerts(problems: list[str]) -> list[Firing]:
    """The audit chain failed its check (an event changed, removed or out of its chain)."""
    if not problems:
        return []
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return [
        Firing(
            key="audit-chain",
            kind="audit_broken",
            severity="critical",
            objects={"audit": "chain"},
            message=f"the audit chain fails its check: {problems[0]}{more}",
            remedy="see every problem: orbit audit verify; compare with your last checkpoint "
            "(orbit audit verify --anchor FILE); restore the store from a backup if events "
            "were changed",
        )
    ]
