"""The scheduler as the control plane runs it: read a snapshot and the queue from the store,
let the pure pass (orbit.scheduler.ordering) make a plan, keep the pass and its decisions, and
carry the plan out through the one launch path (Launching.launch), where the store commits
each placement in a transaction that refuses a plan made on stale state. A refused placement
waits for the next pass, which sees the state as it is.

One pass runs at a time in a process; a pass asked for while one runs is run once it ends.
In the server the pass runs on the scheduler loop (server/loops.py), with nobody looking;
embedded, whenever a command looks at a waiting run."""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from orbit.core.control.base import ServicePart, Shared
from orbit.core.control.leases import LEASE_S, launcher_id, now
from orbit.core.control.parts import Parts
from orbit.core.control.sched_config import LiveSchedConfig
from orbit.core.execution.ssh.hosts import check_request as check_host
from orbit.forensics.progress import PROGRESS_GLOB, latest_progress
from orbit.model.errors import NotFound, OrbitError, Refused
from orbit.model.hosts import HostRecord
from orbit.model.models import ExecutionRequest, FailureReason, RunState
from orbit.model.models import Placement as Placement_
from orbit.model.records import RunRecord
from orbit.scheduler.codec import dumps, pass_out
from orbit.scheduler.config import config_to_dict
from orbit.scheduler.explain import one_line
from orbit.scheduler.model import NodeView, Quota, Request, SchedConfig
from orbit.scheduler.node_views import hosts_snapshot, snapshot_of
from orbit.scheduler.ordering import collector_paused, schedule
from orbit.scheduler.plan import Placement, Plan, Preemption
from orbit.scheduler.plugins import site_checks
from orbit.scheduler.request_views import check_request, eta_from_progress, request_of
from orbit.store.base import new_id
from orbit.store.scheduling import DecisionRow

ETA_EVERY_S = 30.0  # how often a running attempt's progress is read for estimated starts
PASSES_IN_A_ROW = 3  # a pass asked for during a pass runs after it, at most this many more
_VOLATILE = ("waited_s", "snapshot", "config")  # what every pass changes
NODE_WAIT_S = 300.0  # an attempt waiting for a free node is woken when a slot frees (an
# attempt on a node ends, a node joins, syncs or gets room: store.runs.wake_waiting_for_nodes),
# oldest first, each passing a slot it cannot use on to the next; this long is a safety net


def _overflows(row: dict[str, Any]) -> bool:
    """Whether a waiting run's template lets it overflow (placement.overflow, checked at
    submit by the backend's validate), read from its stored request: request_of has validated
    it whole once this pass already, and a pass may hold thousands."""
    return bool(getattr(row["request"].placement, "overflow", False))


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


# the passes asked for within one_pass_after (in this thread or task): one, at its end
_batch: ContextVar[list[bool] | None] = ContextVar("orbit_pass_batch", default=None)


class Scheduling(ServicePart):
    def __init__(self, shared: Shared, parts: Parts) -> None:
        super().__init__(shared, parts)
        self._sched_lock = threading.Lock()  # one pass at a time in this service
        self._sched_again = False

    # --- config ----------------------------------------------------------------------------

    def quotas(self) -> tuple[Quota, ...]:
        return tuple(
            Quota(scope=r["scope"], name=r["name"], gpus=int(r["gpus"]), weight=float(r["weight"]))
            for r in self.store.scheduling.list_quotas()
        )

    @property
    def live_config(self) -> LiveSchedConfig:
        """The scheduler config in force, its file watched: one per service."""
        found = self.__dict__.get("_live_config")
        if found is None:
            made = LiveSchedConfig(
                self.store, self.config.scheduler_config_file, self.config.scheduler_config_named
            )
            found = self.__dict__.setdefault("_live_config", made)
        assert isinstance(found, LiveSchedConfig)
        return found

    def scheduler_config(self) -> SchedConfig:
        """The live config (ORBIT_SCHEDULER_CONFIG, or $ORBIT_HOME/scheduler.yaml, as last
        seen valid) with the store's quotas; its site checks are installed."""
        return self.live_config.config(self.quotas())

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
        from orbit.scheduler.submit_check import never_fits

        nodes = self.store.nodes.list_nodes()
        if nodes:
            why = never_fits(request, nodes, now(), config, service_field)
            if why is not None:
                raise Refused(why + " (--queue-anyway queues it for nodes yet to join)")

    # --- a pass ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def one_pass_after(self) -> Iterator[None]:
        """The passes asked for within are one pass, asked for at the end: a sweep's thousand
        runs queue, then the scheduler looks at them once."""
        wanted: list[bool] = []
        token = _batch.set(wanted)
        try:
            yield
        finally:
            _batch.reset(token)
            if wanted:
                self.request_schedule()

    def request_schedule(self) -> None:
        batch = _batch.get()
        if batch is not None:  # within one_pass_after: one pass at its end
            batch[:] = [True]
            return
        if self.shared.pass_wanted.heard:  # a server: passes run on its scheduler loop
            self.shared.pass_wanted()
        else:
            self.schedule_pass()

    def schedule_pass(self) -> Plan | None:
        """Run a pass now, unless one of this service's is running (it will run again once it
        ends). The last pass's plan, or None if it was left to the running one."""
        lock = self._sched_lock
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
        rows = self.store.scheduling.scheduler_rows(at)
        if not rows.pending:
            return Plan()
        etas = self._etas(rows.placed, at)
        snapshot = snapshot_of(
            rows.nodes, rows.placed, at, config, self.config.node_offline_s, etas
        )
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
        snapshot = hosts_snapshot(
            list(hosts.values()), self.store.scheduling.on_hosts(), at, config, pool
        )
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
        request = self.parts.launching.request_for(run, run.current).model_copy(
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
        if not self.store.scheduling.overflow_attempt(
            attempt.id, request.backend_key, host, list(gpus), claim
        ):
            return  # placed, launched or claimed meanwhile
        claimed = self.store.runs.get_attempt(attempt.id)
        if not self.shared.pass_wanted.heard:  # embedded: no loop to keep free
            self.parts.launching.launch(run, claimed, request)
            return
        # in the server, beside the loop: staging to a rented host (an rsync of the bundle)
        # must not hold up the next pass's placements in the pool
        threading.Thread(
            target=self.parts.launching.launch,
            args=(run, claimed, request),
            name="overflow-launch",
            daemon=True,
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
            attempt = self.store.runs.get_attempt(attempt_id)
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
        self.store.scheduling.save_pass(
            new_id("pass"), at, config_to_dict(config), inputs, decisions, counts, waits
        )

    def _preempt(self, preemption: Preemption, at: Any) -> None:
        """Stop the victims gracefully (SIGTERM, their grace, then kill) for the run the room
        is made for: each ends terminated (preempted) and its run gets a new attempt that
        resumes from its checkpoint (Lifecycle._retry_for)."""
        victims = [v.attempt_id for v in preemption.victims]
        marked = self.store.scheduling.mark_preempted(
            preemption.node_id, victims, preemption.run_id, at, actor="orbit"
        )
        for attempt_id in marked:
            attempt = self.store.runs.get_attempt(attempt_id)
            if attempt.handle is None:
                continue
            with contextlib.suppress(OrbitError):
                backend = self.execution.backend(attempt.handle.backend_key)
                backend.cancel(attempt.handle, FailureReason.PREEMPTED)

    def _still_placeable(self, placement: Placement) -> RunRecord | None:
        """The placed run, if its current attempt is still the one placed and not launched
        (it may have moved on meanwhile: cancelled, say)."""
        try:
            run = self.store.runs.get_run(placement.run_id)
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
            # its checkpoint is still on its way: the report that it is in asks again (and a
            # node that stops sending is waited for a minute at most: earlier_files_in)
            self.store.attempts.note_attempt(
                attempt.id,
                RunState.PREPARED,
                f"placed on {name}: waiting for attempt {earlier[-1].number}'s files (its "
                "checkpoint) to reach the control plane",
            )
            return
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
        self.parts.launching.launch(
            run, attempt, self.parts.launching.request_for(run, attempt), placement=where
        )
