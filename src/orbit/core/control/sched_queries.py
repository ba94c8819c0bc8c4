"""What people ask of the scheduler beside its passes (core/control/scheduling.py): a run's
decision explained (and made again from what the pass saw), the queue, the quotas (read and
set: admin settings), and a scheduler config tried on recorded history."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from orbit.core.control.base import ServicePart
from orbit.core.control.leases import now
from orbit.core.control.views import Explanation, QueueEntry, QuotaView, Simulation
from orbit.model.errors import InvalidInput, NotFound
from orbit.model.models import RunState
from orbit.scheduler.codec import dumps, pass_in
from orbit.scheduler.config import config_from_dict
from orbit.scheduler.gpu_hours import GpuHours
from orbit.scheduler.ordering import schedule
from orbit.scheduler.plugins import site_checks
from orbit.store.scheduling import unpack
from orbit.store.sql import read_json


class SchedulerQueries(ServicePart):
    # --- reading decisions -------------------------------------------------------------------

    def explain(self, ref: str, replay: bool = False) -> Explanation:
        """The run's latest decision as stored; with `replay`, also made again from the
        stored snapshot and config, and whether it came out byte for byte the same."""
        run = self.store.runs.get_run(ref)
        row = self.store.scheduling.get_decision(run.id)
        if row is None and run.current.held:
            raise NotFound(
                f"run {run.id} has no scheduler decision yet: it is queued once its "
                f"dependencies have ended ({run.current.message})"
            )
        if row is None:
            raise NotFound(
                f"run {run.id} has no scheduler decision (only agent-pool runs are scheduled)"
            )
        decision = json.loads(row["body"])
        if not replay:
            return Explanation(decision=decision, pass_id=row["pass_id"])
        config_raw, inputs = self.store.scheduling.get_pass(row["pass_id"])
        snapshot, queue = pass_in(json.loads(inputs))
        config = config_from_dict(config_raw)
        again = schedule(snapshot, queue, config, *site_checks(config)).decisions.get(run.id)
        return Explanation(
            decision=decision,
            pass_id=row["pass_id"],
            replay_identical=again is not None and dumps(again) == row["body"].encode(),
            replayed=again,
        )

    def queue(self) -> list[QueueEntry]:
        """Agent-pool runs not launched yet: those waiting to be placed by tier and position,
        then those in a retry's backoff or placed and not started; each with what it waits
        for as of now (core/control/waits.py); then the runs of any placement held on their
        dependencies (`after:`)."""
        from orbit.core.control.waits import queue_entries

        return queue_entries(self.store) + self.parts.gate.held_in_queue()

    # --- quotas (admin settings) --------------------------------------------------------------

    def list_quotas(self) -> list[QuotaView]:
        return [
            QuotaView(
                scope=r["scope"],
                name=r["name"],
                gpus=int(r["gpus"]),
                weight=float(r["weight"]),
                updated_by=r["updated_by"],
            )
            for r in self.store.scheduling.list_quotas()
        ]

    def set_quota(self, scope: str, name: str, gpus: int, weight: float = 1.0) -> QuotaView:
        if gpus < 0 or not weight > 0:
            raise InvalidInput("quota: gpus is 0 or more and weight above 0")
        self.store.scheduling.set_quota(scope, name, gpus, weight, actor=self.actor)
        self.parts.scheduling.request_schedule()  # a larger quota may let a run in now
        return next(q for q in self.list_quotas() if (q.scope, q.name) == (scope, name))

    def remove_quota(self, scope: str, name: str) -> None:
        self.store.scheduling.remove_quota(scope, name, actor=self.actor)
        self.parts.scheduling.request_schedule()

    # --- trying a config on recorded history ----------------------------------------------------

    def simulate(self, since_s: float, config: dict[str, Any]) -> Simulation:
        """Replay the passes kept over the last `since_s` seconds under `config` (a scheduler
        config mapping; without its own quotas, the store's), and say which decisions would
        have come out otherwise."""
        new = config_from_dict(config, "config", self.parts.scheduling.quotas())
        moved, placed, waited, preempted = set(), set(), set(), set()
        passes = decisions = same = 0
        for row in self.store.scheduling.passes_since(now() - timedelta(seconds=since_s)):
            snapshot, queue = pass_in(json.loads(unpack(row["inputs"])))
            was = config_from_dict(read_json(row["config"]))
            old = schedule(snapshot, queue, was, *site_checks(was))
            alt = schedule(snapshot, queue, new, *site_checks(new))
            passes += 1
            for run_id, before in old.decisions.items():
                after = alt.decisions[run_id]
                decisions += 1
                was, now_ = before["outcome"], after["outcome"]
                if was == "placed" and now_ == "placed":
                    if before["chosen"]["nodes"] != after["chosen"]["nodes"]:
                        moved.add(run_id)
                        continue
                elif was != "placed" and now_ == "placed":
                    placed.add(run_id)
                    continue
                elif was == "placed":
                    waited.add(run_id)
                    continue
                if before.get("victims") != after.get("victims"):
                    preempted.add(run_id)
                    continue
                same += 1
        return Simulation(
            passes=passes,
            decisions=decisions,
            placed_elsewhere=sorted(moved),
            placed_instead_of_waiting=sorted(placed),
            waiting_instead_of_placed=sorted(waited),
            preempted_differently=sorted(preempted),
            unchanged=same,
        )

    def gpu_hours(self, since: datetime, until: datetime, steps: int = 24) -> GpuHours:
        """GPU-hours per user and experiment over [since, until), and per user in `steps`
        equal steps of it (orbit.scheduler.gpu_hours)."""
        from orbit.scheduler.gpu_hours import gpu_hours

        if not since < until:
            raise InvalidInput("the period's start must come before its end")
        return gpu_hours(self.store.runs.gpu_time(since, until), since, until, steps)

    def gpus_held(self) -> list[tuple[str, str, int]]:
        """(user, experiment, GPUs) of every run starting or running now."""
        from orbit.scheduler.gpu_hours import gpus_of

        active = {RunState.PROVISIONING, RunState.STARTING, RunState.RUNNING}
        return [
            (user, experiment, gpus_of(request if isinstance(request, dict) else {}))
            for user, experiment, request in self.store.runs.holding(active)
        ]
