"""The scheduler's records in the store: what a pass reads (nodes, the attempts placed on
them, the queue), what it writes (its inputs once, each run's decision where it changed, the
message a waiting run shows), the quotas admins set, and the marks of a preemption."""

from __future__ import annotations

import base64
import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from orbit.model.errors import InvalidInput, NotFound
from orbit.model.models import RunState
from orbit.model.nodes import NodeRecord
from orbit.store.attempt_states import ACTIVE_IN
from orbit.store.audit import append_event
from orbit.store.base import Part, utcnow
from orbit.store.nodes import NODE_COLUMNS, node_records
from orbit.store.run_queries import with_request
from orbit.store.sql import Row

PASS_KEEP = timedelta(days=7)  # a pass no decision refers to is kept this long (simulate)


@dataclass(frozen=True)
class SchedRows:
    nodes: list[NodeRecord]
    placed: list[Row]  # attempts on a node that have not ended, with their run's request
    pending: list[Row]  # agent-pool attempts waiting to be placed, with their run's request


@dataclass(frozen=True)
class DecisionRow:
    run_id: str
    attempt_id: str
    outcome: str
    tier: str
    position: int
    body: bytes
    gist: str


def pack(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data, 6)).decode()


def unpack(text: str) -> bytes:
    return zlib.decompress(base64.b64decode(text))


_RUN_FIELDS = (
    "r.request, r.submission, r.created_by, r.created_at AS run_created_at, e.name AS experiment"
)


class SchedulerRows(Part):
    def scheduler_rows(self, at: datetime) -> SchedRows:
        """One consistent read of everything a pass needs."""
        with self._read() as tx:
            nodes = node_records(tx, tx.all(f"SELECT {NODE_COLUMNS} FROM nodes ORDER BY name"))
            placed = tx.all(
                "SELECT a.id, a.run_id, a.node_id, a.node_gpus, a.started_at, a.created_at, "
                f"a.preempted_by, {_RUN_FIELDS} FROM attempts a JOIN runs r ON r.id = a.run_id "
                "JOIN experiments e ON e.id = r.experiment_id "
                f"WHERE a.node_id IS NOT NULL AND a.state IN {ACTIVE_IN} ORDER BY a.id"
            )
            pending = tx.all(
                f"SELECT a.id, a.run_id, a.created_at, {_RUN_FIELDS} FROM attempts a "
                "JOIN runs r ON r.id = a.run_id JOIN experiments e ON e.id = r.experiment_id "
                "WHERE a.state = :prepared AND a.handle IS NULL AND a.node_id IS NULL "
                "AND a.lease_owner IS NULL AND a.held IS NULL AND a.backend_key LIKE 'agent_pool%' "
                "AND a.cancel_requested = :no AND (a.not_before IS NULL OR a.not_before <= :at "
                "OR EXISTS (SELECT 1 FROM sched_decisions d WHERE d.attempt_id = a.id)) "
                "ORDER BY a.id",
                {"prepared": RunState.PREPARED.value, "at": at, "no": False},
            )
        return SchedRows(nodes, with_request(placed), with_request(pending))

    def on_hosts(self) -> list[Row]:
        """Attempts on registered SSH hosts that have not ended (their host in `target`), with
        their run's request: what counts against a host when runs overflow onto it."""
        with self._read() as tx:
            return with_request(
                tx.all(
                    "SELECT a.id, a.run_id, a.target, a.node_gpus, a.started_at, a.created_at, "
                    f"a.preempted_by, {_RUN_FIELDS} FROM attempts a JOIN runs r ON r.id = a.run_id "
                    "JOIN experiments e ON e.id = r.experiment_id "
                    f"WHERE a.state IN {ACTIVE_IN} AND a.target IS NOT NULL "
                    "AND (a.backend_key LIKE 'ssh%' OR a.backend_key LIKE 'targon_rental%') "
                    "ORDER BY a.id"
                )
            )

    def overflow_attempt(
        self,
        attempt_id: str,
        backend_key: str,
        host: str,
        gpus: list[int],
        launcher: tuple[str, datetime],
    ) -> bool:
        """An agent-pool attempt the scheduler placed on an SSH host instead (the pool was
        full): from now on it is that host's, launched and looked at by its backend, with the
        GPUs it was given there, and claimed for launching by `launcher` (owner, until) in the
        same move, so that no other replica's pool placement can take it meanwhile. False if
        it was launched, placed or claimed meanwhile."""
        with self._write() as tx:
            moved = tx.execute(
                # due a look now: its wait for the pool put its next look minutes off
                "UPDATE attempts SET backend_key = :key, target = :host, not_before = NULL, "
                "reconcile_due_at = NULL, message = NULL, node_gpus = :gpus, "
                "lease_owner = :owner, lease_expires_at = :until WHERE id = :id "
                "AND state = 'prepared' AND handle IS NULL AND node_id IS NULL "
                "AND lease_owner IS NULL",
                {
                    "key": backend_key,
                    "host": host,
                    "id": attempt_id,
                    "gpus": {"indices": gpus},
                    "owner": launcher[0],
                    "until": launcher[1],
                },
            )
            if moved == 1:
                run_id = tx.scalar("SELECT run_id FROM attempts WHERE id = :a", {"a": attempt_id})
                append_event(
                    tx,
                    "orbit",
                    "attempt.overflowed",
                    run_id=run_id,
                    attempt_id=attempt_id,
                    host=host,
                    backend=backend_key,
                )
        return moved == 1

    def save_pass(
        self,
        pass_id: str,
        at: datetime,
        config: dict[str, Any],
        inputs: bytes,
        decisions: list[DecisionRow],
        counts: tuple[int, int, int],
        waits: dict[str, tuple[str, datetime]],
    ) -> int:
        """Keep a pass: its inputs (once), the decisions that changed since the run's last,
        and the message and next look of each run that waits. A pass that changed nothing is
        not kept. How many decisions were written."""
        ids = [d.run_id for d in decisions]
        with self._write() as tx:
            known: dict[str, str] = {}
            for chunk in range(0, len(ids), 500):
                part = ids[chunk : chunk + 500]
                marks = ", ".join(f":r{n}" for n in range(len(part)))
                for row in tx.all(
                    f"SELECT run_id, gist FROM sched_decisions WHERE run_id IN ({marks})",
                    {f"r{n}": rid for n, rid in enumerate(part)},
                ):
                    known[row["run_id"]] = row["gist"]
            changed = [d for d in decisions if known.get(d.run_id) != d.gist]
            if changed or counts[0] or counts[2]:
                tx.execute(
                    "INSERT INTO sched_passes (id, at, config, inputs, placed, waiting, "
                    "preempted) VALUES (:id, :at, :config, :inputs, :p, :w, :x)",
                    {
                        "id": pass_id,
                        "at": at,
                        "config": config,
                        "inputs": pack(inputs),
                        "p": counts[0],
                        "w": counts[1],
                        "x": counts[2],
                    },
                )
            for d in changed:
                values = {
                    "run": d.run_id,
                    "att": d.attempt_id,
                    "pass": pass_id,
                    "outcome": d.outcome,
                    "tier": d.tier,
                    "pos": d.position,
                    "body": d.body.decode(),
                    "gist": d.gist,
                    "at": at,
                }
                # an upsert, not "update if we saw it": another server's pass may have
                # written this run's first decision since we read (replicas race here)
                tx.execute(
                    "INSERT INTO sched_decisions (run_id, attempt_id, pass_id, outcome, "
                    "tier, position, body, gist, at) VALUES (:run, :att, :pass, :outcome, "
                    ":tier, :pos, :body, :gist, :at) ON CONFLICT (run_id) DO UPDATE SET "
                    "attempt_id = excluded.attempt_id, pass_id = excluded.pass_id, "
                    "outcome = excluded.outcome, tier = excluded.tier, "
                    "position = excluded.position, body = excluded.body, "
                    "gist = excluded.gist, at = excluded.at",
                    values,
                )
            for attempt_id, (message, due) in waits.items():
                tx.execute(
                    "UPDATE attempts SET message = :m, not_before = :due, reconcile_due_at = :due "
                    "WHERE id = :id AND state = :prepared AND node_id IS NULL "
                    "AND lease_owner IS NULL",
                    {"m": message, "due": due, "id": attempt_id, "prepared": "prepared"},
                )
            tx.execute(
                "DELETE FROM sched_passes WHERE at < :old AND id NOT IN "
                "(SELECT pass_id FROM sched_decisions)",
                {"old": at - PASS_KEEP},
            )
        return len(changed)

    def get_decision(self, run_id: str) -> Row | None:
        with self._read() as tx:
            return tx.one(
                "SELECT run_id, attempt_id, pass_id, outcome, tier, position, body, at "
                "FROM sched_decisions WHERE run_id = :r",
                {"r": run_id},
            )

    def get_pass(self, pass_id: str) -> tuple[dict[str, Any], bytes]:
        """A pass's config and its inputs (canonical JSON bytes)."""
        with self._read() as tx:
            row = tx.one("SELECT config, inputs FROM sched_passes WHERE id = :id", {"id": pass_id})
        if row is None:
            raise NotFound(f"scheduler pass {pass_id} is no longer kept")
        from orbit.store.sql import read_json

        return read_json(row["config"]), unpack(row["inputs"])

    def passes_since(self, since: datetime) -> list[Row]:
        with self._read() as tx:
            return tx.all(
                "SELECT id, at, config, inputs FROM sched_passes WHERE at >= :s ORDER BY at, id",
                {"s": since},
            )

    def mark_preempted(
        self, node_id: str, victims: list[str], for_run: str, at: datetime, actor: str
    ) -> list[str]:
        """Mark attempts as being stopped for `for_run`, and the node as having had work
        pushed off now. Only attempts not already marked; returns those marked."""
        marked = []
        with self._write() as tx:
            for attempt_id in victims:
                row = tx.one(
                    "SELECT run_id FROM attempts WHERE id = :a AND preempted_by IS NULL "
                    f"AND state IN {ACTIVE_IN}",
                    {"a": attempt_id},
                )
                if row is None:
                    continue
                tx.execute(
                    "UPDATE attempts SET preempted_by = :r WHERE id = :a",
                    {"r": for_run, "a": attempt_id},
                )
                append_event(
                    tx,
                    actor,
                    "attempt.preempted",
                    run_id=row["run_id"],
                    attempt_id=attempt_id,
                    for_run=for_run,
                )
                marked.append(attempt_id)
            if marked:
                tx.execute(
                    "UPDATE nodes SET preempted_at = :at WHERE id = :n", {"at": at, "n": node_id}
                )
        return marked

    # --- quotas ------------------------------------------------------------------------------

    def list_quotas(self) -> list[Row]:
        with self._read() as tx:
            return tx.all(
                "SELECT scope, name, gpus, weight, updated_at, updated_by FROM quotas "
                "ORDER BY scope, name"
            )

    def set_quota(self, scope: str, name: str, gpus: int, weight: float, actor: str) -> None:
        if scope not in ("user", "experiment"):
            raise InvalidInput(f"quota scope: expected user or experiment, not '{scope}'")
        with self._write() as tx:
            tx.execute("DELETE FROM quotas WHERE scope = :s AND name = :n", {"s": scope, "n": name})
            tx.execute(
                "INSERT INTO quotas (scope, name, gpus, weight, updated_at, updated_by) "
                "VALUES (:s, :n, :g, :w, :at, :by)",
                {"s": scope, "n": name, "g": gpus, "w": weight, "at": utcnow(), "by": actor},
            )
            append_event(tx, actor, "quota.set", scope=scope, name=name, gpus=gpus, weight=weight)

    def remove_quota(self, scope: str, name: str, actor: str) -> None:
        with self._write() as tx:
            gone = tx.execute(
                "DELETE FROM quotas WHERE scope = :s AND name = :n", {"s": scope, "n": name}
            )
            if not gone:
                raise NotFound(f"no quota for {scope} '{name}'")
            append_event(tx, actor, "quota.removed", scope=scope, name=name)
