"""The scheduler as the control plane runs it: read a snapshot and the queue from the store,
let the pure pass (orbit.scheduler.plan) make a plan, keep the pass and its decisions, and
carry the plan out through the one launch path (Lifecycle._launch), where the store commits
each placement in a transaction that refuses a plan made on stale state. A refused placement
waits for the next pass, which sees the state as it is.

One pass runs at a time in a process; a pass asked for while one runs is run once it ends.
In the server the pass runs on the scheduler loop (server/loops.py), with nobody looking;
embedded, whenever a command looks at a waiting run."""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from orbit.core.control.lifecycle import LEASE_S, NODE_WAIT_S, Lifecycle, launcher_id, now
from orbit.core.control.views import Explanation, QueueEntry, QuotaView, Simulation
from orbit.core.errors import InvalidInput, NotFound, OrbitError, Refused
from orbit.core.execution.ssh.hosts import check_request as check_host
from orbit.core.hosts import HostRecord
from orbit.core.models import ExecutionRequest, FailureReason
from orbit.core.models import Placement as Placement_
from orbit.core.records import RunRecord
from orbit.forensics.progress import PROGRESS_GLOB, latest_progress
from orbit.scheduler.checks import site_checks
from orbit.scheduler.codec import dumps, pass_in, pass_out
from orbit.scheduler.config import config_from_dict, config_to_dict, load_config
from orbit.scheduler.explain import one_line
from orbit.scheduler.inputs import (
    check_request,
    eta_from_progress,
    hosts_snapshot,
    request_of,
    snapshot_of,
)
from orbit.scheduler.model import NodeView, Quota, Request, SchedConfig
from orbit.scheduler.plan import Placement, Plan, Preemption, collector_paused, schedule
from orbit.store.base import new_id
from orbit.store.scheduling import DecisionRow, unpack
from orbit.store.sql import read_json

ETA_EVERY_S = 30.0  # how often a running attempt's progress is read for estimated starts
PASSES_IN_A_ROW = 3  # a pass asked for during a pass runs after it, at most this many more
_VOLATILE = ("waited_s", "snapshot", "config")  # what every pass changes


def _overflows(row: dict[str, Any]) -> bool:
    """Whether a waiting run's template lets it overflow (placement.overflow, checked at
    submit by the backend's validate), read from its stored request: request_of has validated
    it whole once this pass already, and a pass may hold thousands."""
    placement = (read_json(row["request"]) or {}).get("placement") or {}
    return bool(placement.get("overflow"))


def gist(record: dict[str, Any]) -> str:
    """A decision but for what changes every pass: a run's decision is kept again only when
    this changes (it moved, or the reason it waits did)."""
    body = {k: v for k, v in record.items() if k not in _VOLATILE}
    return hashlib.sha256(dumps(body)).hexdigest()[:32]


def decision_row(record: dict[str, Any]) -> DecisionRow:
    """A pass's decision for one run as the store keeps it: its bytes, and its gist."""
    return DecisionRow(
        run_id=record["run"],
        attempt_id=record["attempt"],
        outcome=record["outcome"],
        tier=record["tier"],
        position=record["position"],
        body=dumps(record),
        gist=gist(record),
    )


class Scheduling(Lifecycle):
    scheduler_config_file: Path | None = None
    schedule_hook: Callable[[], None] | None = None  # set by the server: passes run on its loop
    _sched_lock: threading.Lock | None = None
    _sched_again = False

    # --- config ----------------------------------------------------------------------------

    def quotas(self) -> tuple[Quota, ...]:
        return tuple(
            Quota(scope=r["scope"], name=r["name"], gpus=int(r["gpus"]), weight=float(r["weight"]))
            for r in self.store.list_quotas()
        )

    def scheduler_config(self) -> SchedConfig:
        """The config file (ORBIT_SCHEDULER_CONFIG, or $ORBIT_HOME/scheduler.yaml) with the
        store's quotas; the site checks it names must be installed."""
        config = load_config(self.scheduler_config_file, self.quotas())
        site_checks(config)
        return config

    def check_schedulable(
        self,
        request: ExecutionRequest,
        queue_anyway: bool = False,
        service_field: str = "task.service",
    ) -> None:
        """Refuse at submit what the scheduler can never place: an unknown model or tier, or
        (unless `queue_anyway`) an ask no registered node could ever hold, with the largest
        node's figures."""
        if not request.backend_key.startswith("agent_pool"):
            return
        config = self.scheduler_config()
        check_request(request, config)
        if queue_anyway:
            return
        from orbit.scheduler.inputs import never_fits

        nodes = self.store.list_nodes()
        if nodes:
            why = never_fits(request, nodes, now(), config, service_field)
            if why is not None:
                raise Refused(why + " (--queue-anyway queues it for nodes yet to join)")

    # --- a pass ----------------------------------------------------------------------------

    def request_schedule(self) -> None:
        if self.schedule_hook is not None:
            self.schedule_hook()
        else:
            self.schedule_pass()

    def schedule_pass(self) -> Plan | None:
        """Run a pass now, unless one is running in this process (it will run again once it
        ends). The last pass's plan, or None if it was left to the running one."""
        if self._sched_lock is None:
            type(self)._sched_lock = threading.Lock()
        lock = self._sched_lock
        assert lock is not None
        if not lock.acquire(blocking=False):
            self._sched_again = True
            return None
        try:
            plan = None
            for _ in range(PASSES_IN_A_ROW + 1):
                self._sched_again = False
                plan = self._one_pass()
                if not self._sched_again:
                    break
            return plan
        finally:
            lock.release()

    def _one_pass(self) -> Plan:
        at = now()
        config = self.scheduler_config()
        rows = self.store.scheduler_rows(at)
        if not rows.pending:
            return Plan()
        etas = self._etas(rows.placed, at)
        snapshot = snapshot_of(rows.nodes, rows.placed, at, config, self.node_offline_s, etas)
        queue = [request_of(row, config) for row in rows.pending]
        with collector_paused():  # the pass, and its records made and kept
            plan = schedule(snapshot, queue, config, *site_checks(config))
            self._keep(plan, at, config, dumps(pass_out(snapshot, queue)))
        for preemption in plan.preemptions:
            self._preempt(preemption, at)
        for placement in plan.placements:
            self._launch_placed(placement)
        self._overflow(rows.pending, queue, plan, at, config, snapshot.nodes)
        return plan

    def _overflow(
        self,
        pending: list[dict[str, Any]],
        queue: list[Request],
        plan: Plan,
        at: datetime,
        config: SchedConfig,
        pool: tuple[NodeView, ...],
    ) -> None:
        """In-house first, rentals when the pool is full: a run whose template names overflow
        placements (placement.overflow: [ssh]) and that the pool pass left waiting (not for
        its quota; a gang stays in the pool) gets a second pass over the registered SSH
        hosts, with what runs on them. What it places there is kept as a pass of its own (so
        explain --replay makes it again) and launched on that host; the others keep the pool
        pass's decision."""
        rows = {row["id"]: row for row in pending}
        waiting = []
        for req in queue:
            record = plan.decisions.get(req.run_id)
            if (
                req.num_nodes == 1
                and record is not None
                and record["outcome"] == "waiting"
                and not any("quota" in t for t in record.get("alternatives", ()))
                and _overflows(rows[req.attempt_id])
            ):
                waiting.append(req)
        if not waiting:
            return
        hosts = {h.name: h for h in self.hosts.all()}
        snapshot = hosts_snapshot(list(hosts.values()), self.store.on_hosts(), at, config, pool)
        if not snapshot.nodes:
            return
        # nobody's work is pushed off a rented host to make room: it is not ours to churn
        config = replace(config, preemption=False)
        second = schedule(snapshot, waiting, config, *site_checks(config))
        launches = []
        for placement in second.placements:
            found = self._overflowed(placement, hosts)
            if found is not None:
                launches.append((placement, *found))
        if not launches:
            return
        placed = Plan(
            decisions={p.run_id: second.decisions[p.run_id] for p, _, _ in launches},
            placements=[p for p, _, _ in launches],
        )
        self._keep(placed, at, config, dumps(pass_out(snapshot, waiting)))
        for placement, run, request in launches:
            self._launch_overflow(placement, run, request)

    def _overflowed(
        self, placement: Placement, hosts: dict[str, HostRecord]
    ) -> tuple[RunRecord, ExecutionRequest] | None:
        """The run, and its request as the host it was placed on runs it; None if the run
        moved on meanwhile, or that host's last check says it cannot run it (no docker, no
        python3, not those GPUs): it then keeps waiting for the pool rather than fail there."""
        run = self._still_placeable(placement)
        if run is None:
            return None
        _, host, _ = placement.nodes[0]
        request = self._request_for(run, run.current).model_copy(
            update={"placement": Placement_(kind="ssh"), "target": host}
        )
        try:
            check_host(hosts[host], request)
        except (OrbitError, KeyError):
            return None
        return run, request

    def _launch_overflow(
        self, placement: Placement, run: RunRecord, request: ExecutionRequest
    ) -> None:
        """Launch a run the overflow pass placed on an SSH host: the attempt becomes that
        host's (its backend, target and GPUs) and is claimed for launching in one move (which
        refuses an attempt launched, placed or claimed since it was read), then goes the way
        any SSH launch goes."""
        attempt = run.current
        _, host, gpus = placement.nodes[0]
        claim = (launcher_id(), now() + timedelta(seconds=LEASE_S))
        if not self.store.overflow_attempt(
            attempt.id, request.backend_key, host, list(gpus), claim
        ):
            return  # placed, launched or claimed meanwhile
        claimed = self.store.get_attempt(attempt.id)
        if self.schedule_hook is None:
            self._launch(run, claimed, request)
            return
        # in the server, beside the loop: staging to a rented host (an rsync of the bundle)
        # must not hold up the next pass's placements in the pool
        threading.Thread(
            target=self._launch, args=(run, claimed, request), name="overflow-launch", daemon=True
        ).start()

    def _etas(self, placed: list[dict[str, Any]], at: datetime) -> dict[str, float]:
        """When each running attempt will likely end by its progress (its logging.jsonl), for
        the waiting runs' estimated starts. Each attempt's progress is read at most every
        ETA_EVERY_S: a pass must not read every running attempt's files."""
        cache: dict[str, tuple[float, float | None]] = self.__dict__.setdefault("_eta_cache", {})
        live = {row["id"] for row in placed}
        for gone in set(cache) - live:
            del cache[gone]
        out = {}
        for row in placed:
            read_at, eta = cache.get(row["id"], (float("-inf"), None))
            if at.timestamp() - read_at >= ETA_EVERY_S:
                started, eta = self._eta_of(row["id"], at)
                if started:  # one not started yet is asked again next pass
                    cache[row["id"]] = (at.timestamp(), eta)
            if eta is not None:
                out[row["id"]] = eta
        return out

    def _eta_of(self, attempt_id: str, at: datetime) -> tuple[bool, float | None]:
        """Whether the attempt has started, and when its progress says it will end."""
        try:
            attempt = self.store.get_attempt(attempt_id)
            if attempt.handle is None or attempt.started_at is None:
                return False, None
            backend = self.execution.backend(attempt.handle.backend_key)
            progress = latest_progress(backend.tail_files(attempt.handle, PROGRESS_GLOB, 8192))
        except OrbitError:  # gone meanwhile, or its files cannot be read now: no estimate
            return True, None
        if progress is None:
            return True, None
        return True, eta_from_progress(progress.step, progress.max_steps, attempt.started_at, at)

    def _keep(self, plan: Plan, at: Any, config: SchedConfig, inputs: bytes) -> None:
        decisions, waits = [], {}
        due = at + timedelta(seconds=NODE_WAIT_S)
        for record in plan.decisions.values():
            decisions.append(decision_row(record))
            if record["outcome"] != "placed":
                waits[record["attempt"]] = (one_line(record), due)
        counts = (len(plan.placements), len(waits), len(plan.preemptions))
        self.store.save_pass(
            new_id("pass"), at, config_to_dict(config), inputs, decisions, counts, waits
        )

    def _preempt(self, preemption: Preemption, at: Any) -> None:
        """Stop the victims gracefully (SIGTERM, their grace, then kill) for the run the room
        is made for: each ends terminated (preempted) and its run gets a new attempt that
        resumes from its checkpoint (Lifecycle._retry_for)."""
        victims = [v.attempt_id for v in preemption.victims]
        marked = self.store.mark_preempted(
            preemption.node_id, victims, preemption.run_id, at, actor="orbit"
        )
        for attempt_id in marked:
            attempt = self.store.get_attempt(attempt_id)
            if attempt.handle is None:
                continue
            with contextlib.suppress(OrbitError):
                backend = self.execution.backend(attempt.handle.backend_key)
                backend.cancel(attempt.handle, FailureReason.PREEMPTED)

    def _still_placeable(self, placement: Placement) -> RunRecord | None:
        """The placed run, if its current attempt is still the one placed and not launched
        (it may have moved on meanwhile: cancelled, say)."""
        try:
            run = self.store.get_run(placement.run_id)
        except NotFound:
            return None
        attempt = run.current
        if attempt.id != placement.attempt_id or attempt.handle is not None:
            return None
        return run

    def _launch_placed(self, placement: Placement) -> None:
        run = self._still_placeable(placement)
        if run is None:
            return
        attempt = run.current
        node_id, name, gpus = placement.nodes[0]
        ask = placement.ask
        earlier = [a for a in run.attempts if a.number < attempt.number]
        resume_from = earlier[-1].id if earlier and attempt.trigger == "auto_retry" else None
        backend = self.execution.backend(attempt.backend_key)
        if resume_from and not getattr(backend, "earlier_files_in", lambda _: True)(resume_from):
            return  # its checkpoint is still on its way: the report that it is in asks again
        where: dict[str, Any] = {
            "resume_from": resume_from,
            "node_id": node_id,
            "node": name,
            "gpus": list(gpus),
            "gpu_share_gb": ask.gpu_share_gb,
            "cpus": ask.cpus,
            "memory_gb": ask.memory_gb,
        }
        if len(placement.nodes) > 1:  # a gang: every rank's node, rank 0 first
            where["gang"] = [
                {"node_id": n, "node": m, "gpus": list(g)} for n, m, g in placement.nodes
            ]
        self._launch(run, attempt, self._request_for(run, attempt), placement=where)

    # --- reading decisions -------------------------------------------------------------------

    def explain(self, ref: str, replay: bool = False) -> Explanation:
        """The run's latest decision as stored; with `replay`, also made again from the
        stored snapshot and config, and whether it came out byte for byte the same."""
        run = self.store.get_run(ref)
        row = self.store.get_decision(run.id)
        if row is None:
            raise NotFound(
                f"run {run.id} has no scheduler decision (only agent-pool runs are scheduled)"
            )
        decision = json.loads(row["body"])
        if not replay:
            return Explanation(decision=decision, pass_id=row["pass_id"])
        config_raw, inputs = self.store.get_pass(row["pass_id"])
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
        """Runs waiting to be placed, by tier and position, each with its one-line reason."""
        out = []
        for row in self.store.queued_decisions():
            record = json.loads(row["body"])
            out.append(
                QueueEntry(
                    run=row["run_id"],
                    tier=row["tier"],
                    position=row["position"],
                    outcome=row["outcome"],
                    reason=one_line(record),
                    waited_s=record.get("waited_s", 0.0),
                    estimated_start=(
                        datetime.fromtimestamp(record["estimated_start"], UTC)
                        if record.get("estimated_start")
                        else None
                    ),
                )
            )
        return out

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
            for r in self.store.list_quotas()
        ]

    def set_quota(self, scope: str, name: str, gpus: int, weight: float = 1.0) -> QuotaView:
        if gpus < 0 or not weight > 0:
            raise InvalidInput("quota: gpus is 0 or more and weight above 0")
        self.store.set_quota(scope, name, gpus, weight, actor=self.actor)
        self.request_schedule()  # a larger quota may let a run in now
        return next(q for q in self.list_quotas() if (q.scope, q.name) == (scope, name))

    def remove_quota(self, scope: str, name: str) -> None:
        self.store.remove_quota(scope, name, actor=self.actor)
        self.request_schedule()

    # --- trying a config on recorded history ----------------------------------------------------

    def simulate(self, since_s: float, config: dict[str, Any]) -> Simulation:
        """Replay the passes kept over the last `since_s` seconds under `config` (a scheduler
        config mapping; without its own quotas, the store's), and say which decisions would
        have come out otherwise."""
        new = config_from_dict(config, "config", self.quotas())
        moved, placed, waited, preempted = set(), set(), set(), set()
        passes = decisions = same = 0
        for row in self.store.passes_since(now() - timedelta(seconds=since_s)):
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
