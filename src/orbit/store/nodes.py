"""Nodes, their join tokens and their command queues in the store.

Credentials and join tokens are kept as sha256 hashes only. Every change a person makes is
audited; an agent's traffic (heartbeats, acks) is not: the audit records who placed, started,
cancelled or lost an attempt, not each poll."""

from __future__ import annotations

import uuid
from collections import defaultdict
from datetime import datetime
from typing import Any

from orbit.core.errors import InvalidInput, NotFound, Refused
from orbit.core.models import RunState
from orbit.core.nodes import JoinTokenRecord, NodeRecord, NodeState
from orbit.store.audit import append_event
from orbit.store.base import StoreBase, new_id, utcnow
from orbit.store.runs import ACTIVE_IN, wake_waiting_for_nodes
from orbit.store.sql import Conflict, Row, Tx, read_json, read_time, read_time_required

NODE_COLUMNS = (
    "id, name, labels, info, state, max_tasks, created_at, created_by, last_seen_at, session, "
    "report_seq, preempted_at"
)
JOIN_COLUMNS = "id, labels, created_at, created_by, expires_at, revoked_at, uses"
ACTIVE_STATES = tuple(s.value for s in RunState if not s.terminal)


def join_record(row: Row) -> JoinTokenRecord:
    return JoinTokenRecord(
        id=row["id"],
        labels=read_json(row["labels"]) or {},
        created_at=read_time_required(row["created_at"]),
        created_by=row["created_by"],
        expires_at=read_time(row["expires_at"]),
        revoked_at=read_time(row["revoked_at"]),
        uses=int(row["uses"] or 0),
    )


def no_node(ref: str) -> NotFound:
    return NotFound(f"no node '{ref}' (see `orbit nodes list`)")


class NodesMixin(StoreBase):
    # --- join tokens -------------------------------------------------------------------------

    def create_join_token(
        self, token_hash: str, labels: dict[str, str], expires_at: datetime | None, actor: str
    ) -> JoinTokenRecord:
        record = JoinTokenRecord(
            id=new_id("join"),
            labels=labels,
            created_at=utcnow(),
            created_by=actor,
            expires_at=expires_at,
            revoked_at=None,
            uses=0,
        )
        with self._write() as tx:
            tx.execute(
                "INSERT INTO join_tokens (id, hash, labels, created_at, created_by, expires_at, "
                "uses) VALUES (:id, :hash, :labels, :created_at, :created_by, :expires_at, 0)",
                {**record.model_dump(exclude={"revoked_at", "uses"}), "hash": token_hash},
            )
            append_event(tx, actor, "join_token.create", token_id=record.id, labels=labels)
        return record

    def list_join_tokens(self) -> list[JoinTokenRecord]:
        with self._read() as tx:
            rows = tx.all(f"SELECT {JOIN_COLUMNS} FROM join_tokens ORDER BY created_at")
        return [join_record(r) for r in rows]

    def revoke_join_token(self, token_id: str, actor: str) -> None:
        with self._write() as tx:
            changed = tx.execute(
                "UPDATE join_tokens SET revoked_at = :now WHERE id = :id AND revoked_at IS NULL",
                {"now": utcnow(), "id": token_id},
            )
            if changed != 1:
                if tx.one("SELECT id FROM join_tokens WHERE id = :id", {"id": token_id}) is None:
                    raise NotFound(f"no join token '{token_id}'")
                return
            append_event(tx, actor, "join_token.revoke", token_id=token_id)

    # --- nodes -------------------------------------------------------------------------------

    def register_node(
        self,
        join_hash: str,
        name: str,
        labels: dict[str, str],
        max_tasks: int,
        info: dict[str, Any],
        credential_hash: str,
    ) -> NodeRecord:
        """A node joins with a join token: its labels are the token's with its own on top."""
        now = utcnow()
        try:
            with self._write() as tx:
                token = tx.one(
                    f"SELECT {JOIN_COLUMNS} FROM join_tokens WHERE hash = :hash",
                    {"hash": join_hash},
                )
                if token is None:
                    raise Refused("the join token is not known to this server")
                joined = join_record(token)
                if joined.revoked_at is not None:
                    raise Refused(f"join token {joined.id} was revoked")
                if joined.expires_at is not None and joined.expires_at <= now:
                    raise Refused(f"join token {joined.id} expired at {joined.expires_at:%c}")
                node_id = new_id("node")
                merged = {**joined.labels, **labels}
                tx.execute(
                    "INSERT INTO nodes (id, name, credential_hash, labels, info, state, "
                    "max_tasks, created_at, created_by, last_seen_at, report_seq) VALUES "
                    "(:id, :name, :cred, :labels, :info, :state, :max_tasks, :now, :by, :now, 0)",
                    {
                        "id": node_id,
                        "name": name,
                        "cred": credential_hash,
                        "labels": merged,
                        "info": info,
                        "state": NodeState.ACTIVE.value,
                        "max_tasks": max_tasks,
                        "now": now,
                        "by": joined.id,
                    },
                )
                tx.execute(
                    "UPDATE join_tokens SET uses = uses + 1 WHERE id = :id", {"id": joined.id}
                )
                wake_waiting_for_nodes(tx, now, max_tasks)
                append_event(
                    tx,
                    f"node:{name}",
                    "node.register",
                    node=name,
                    node_id=node_id,
                    join_token=joined.id,
                    labels=merged,
                    max_tasks=max_tasks,
                )
        except Conflict:
            raise InvalidInput(
                f"a node named '{name}' is already registered: give this one another --name, "
                f"or `orbit nodes remove {name}` first"
            ) from None
        return self.get_node(node_id)

    def wake_waiting(self, count: int, after: datetime | None = None) -> None:
        """A node joined, came back or got room: the oldest attempts waiting (created after
        `after`, if given) are due now."""
        if count > 0:
            with self._write() as tx:
                wake_waiting_for_nodes(tx, utcnow(), count, after)

    def node_by_credential(self, credential_hash: str) -> NodeRecord | None:
        with self._read() as tx:
            row = tx.one(
                f"SELECT {NODE_COLUMNS} FROM nodes WHERE credential_hash = :h",
                {"h": credential_hash},
            )
            return None if row is None else self._node(tx, row)

    def get_node(self, ref: str) -> NodeRecord:
        """A node by name or id."""
        with self._read() as tx:
            row = tx.one(
                f"SELECT {NODE_COLUMNS} FROM nodes WHERE name = :ref OR id = :ref", {"ref": ref}
            )
            if row is None:
                raise no_node(ref)
            return self._node(tx, row)

    def list_nodes(self) -> list[NodeRecord]:
        with self._read() as tx:
            rows = tx.all(f"SELECT {NODE_COLUMNS} FROM nodes ORDER BY name")
            return self._nodes(tx, rows)

    def _node(self, tx: Tx, row: Row) -> NodeRecord:
        return self._nodes(tx, [row])[0]

    @staticmethod
    def _nodes(tx: Tx, rows: list[Row]) -> list[NodeRecord]:
        running: dict[str, list[str]] = defaultdict(list)
        gpus: dict[str, dict[int, float]] = defaultdict(dict)
        if rows:
            # one node (each agent request's lookup): its own attempts only, by the node_id
            # index, not every active attempt of every node
            one = " AND node_id = :n" if len(rows) == 1 else ""
            for a in tx.all(
                "SELECT id, node_id, node_gpus FROM attempts "
                f"WHERE node_id IS NOT NULL AND state IN {ACTIVE_IN}{one} ORDER BY created_at",
                {"n": rows[0]["id"]} if one else {},
            ):
                running[a["node_id"]].append(a["id"])
                placed = read_json(a["node_gpus"]) or {}
                per_gpu = float(placed.get("memory_gb", 0.0))
                for index in placed.get("indices", ()):
                    have = gpus[a["node_id"]].get(int(index))
                    gpus[a["node_id"]][int(index)] = (
                        0.0 if per_gpu == 0 or have == 0.0 else (have or 0.0) + per_gpu
                    )
        return [
            NodeRecord(
                id=r["id"],
                name=r["name"],
                labels=read_json(r["labels"]) or {},
                info=read_json(r["info"]) or {},
                state=NodeState(r["state"]),
                max_tasks=int(r["max_tasks"]),
                created_at=read_time_required(r["created_at"]),
                created_by=r["created_by"],
                last_seen_at=read_time(r["last_seen_at"]),
                running=tuple(running.get(r["id"], ())),
                gpus_in_use=gpus.get(r["id"], {}),
                preempted_at=read_time(r["preempted_at"]),
            )
            for r in rows
        ]

    def update_node(
        self,
        ref: str,
        actor: str,
        *,
        state: NodeState | None = None,
        max_tasks: int | None = None,
    ) -> NodeRecord:
        node = self.get_node(ref)
        values: dict[str, Any] = {}
        if state is not None and state is not node.state:
            if node.state is NodeState.REVOKED:
                raise Refused(f"node '{node.name}' is revoked: remove it and let it join again")
            values["state"] = state.value
        if max_tasks is not None and max_tasks != node.max_tasks:
            values["max_tasks"] = max_tasks
        if values:
            sets = ", ".join(f"{k} = :{k}" for k in values)
            with self._write() as tx:
                tx.execute(f"UPDATE nodes SET {sets} WHERE id = :id", {**values, "id": node.id})
                append_event(tx, actor, "node.update", node=node.name, **values)
                wake_waiting_for_nodes(tx, utcnow(), max_tasks or node.max_tasks)
        return self.get_node(node.id)

    def remove_node(self, ref: str, actor: str, force: bool) -> NodeRecord:
        node = self.get_node(ref)
        with self._write() as tx:
            busy = tx.scalar(
                f"SELECT count(*) FROM attempts WHERE node_id = :id AND state IN {ACTIVE_IN}",
                {"id": node.id},
            )
            if busy and not force:
                raise Refused(
                    f"node '{node.name}' still runs {busy} attempt(s): drain it and wait, or "
                    "remove it with --force (they are then lost and retried elsewhere)"
                )
            tx.execute("DELETE FROM node_commands WHERE node_id = :id", {"id": node.id})
            tx.execute("DELETE FROM nodes WHERE id = :id", {"id": node.id})
            append_event(tx, actor, "node.remove", node=node.name, force=force, running=busy)
        return node

    def node_seen(self, node_id: str, at: datetime, info: dict[str, Any] | None = None) -> None:
        with self._write() as tx:
            tx.execute(
                "UPDATE nodes SET last_seen_at = :at WHERE id = :id AND "
                "(last_seen_at IS NULL OR last_seen_at < :at)",
                {"at": at, "id": node_id},
            )
            if info is not None:
                tx.execute(
                    "UPDATE nodes SET info = :info WHERE id = :id", {"info": info, "id": node_id}
                )

    def server_back(self) -> int:
        """A server (re)starts: while none ran, no node could be heard, so none is judged
        silent for it. Every node's last word counts from now (a dead one is found one
        timeout later)."""
        with self._write() as tx:
            return tx.execute(
                "UPDATE nodes SET last_seen_at = :now WHERE last_seen_at < :now",
                {"now": utcnow()},
            )

    def nodes_seen(self, seen: dict[str, datetime]) -> None:
        """Many heartbeats in one transaction (the server gathers them for a second)."""
        if not seen:
            return
        with self._write() as tx:
            for node_id, at in seen.items():
                tx.execute(
                    "UPDATE nodes SET last_seen_at = :at WHERE id = :id AND "
                    "(last_seen_at IS NULL OR last_seen_at < :at)",
                    {"at": at, "id": node_id},
                )

    def node_session(self, node_id: str, session: str) -> bool:
        """Record the agent's session; True when it is a new one (its report numbers restart)."""
        with self._write() as tx:
            return (
                tx.execute(
                    "UPDATE nodes SET session = :s, report_seq = 0 WHERE id = :id AND "
                    "(session IS NULL OR session <> :s)",
                    {"s": session, "id": node_id},
                )
                == 1
            )

    def report_is_new(self, node_id: str, session: str, seq: int) -> bool:
        """Whether report `seq` of `session` has not been applied yet (a look, no change)."""
        with self._read() as tx:
            row = tx.one(
                "SELECT 1 AS new FROM nodes WHERE id = :id AND session = :s AND report_seq < :seq",
                {"seq": seq, "id": node_id, "s": session},
            )
        return row is not None

    def advance_report_seq(self, node_id: str, session: str, seq: int) -> bool:
        """Whether report `seq` of `session` is new (then it is recorded as applied)."""
        with self._write() as tx:
            return (
                tx.execute(
                    "UPDATE nodes SET report_seq = :seq WHERE id = :id AND session = :s AND "
                    "report_seq < :seq",
                    {"seq": seq, "id": node_id, "s": session},
                )
                == 1
            )

    # --- placing attempts on nodes, and the one start each gets ------------------------------

    def assign_attempt(
        self,
        attempt_id: str,
        node_id: str,
        gpus: dict[str, Any],
        start: dict[str, Any],
        actor: str,
    ) -> tuple[int, str] | None:
        """Place an attempt on a node and queue its start command, in one transaction that
        checks the node still takes work and has room, by its max_tasks as they are now (two
        launches never both take its last slot; a plan made before an admin cordoned or drained
        it is refused). The start carries that max_tasks: the agent checks against it, not
        against the one its last heartbeat brought. The fence goes up by one each time; returns
        (fence, command id), or None if the node is full or takes no work. Refused for an
        attempt already placed: a launcher that stalled past its lease while another placed
        the attempt must not place it a second time (it would start on two nodes)."""
        with self._write() as tx:
            if tx.dialect == "postgresql":
                tx.execute("SELECT id FROM nodes WHERE id = :id FOR UPDATE", {"id": node_id})
                tx.execute("SELECT id FROM attempts WHERE id = :a FOR UPDATE", {"a": attempt_id})
            if tx.scalar("SELECT node_id FROM attempts WHERE id = :a", {"a": attempt_id}):
                raise Refused(f"attempt {attempt_id} is already placed on a node")
            max_tasks = _room(tx, node_id, attempt_id, gpus)
            if max_tasks is None:
                return None
            fence = (
                int(
                    tx.scalar(
                        "SELECT COALESCE(fence, 0) FROM attempts WHERE id = :a", {"a": attempt_id}
                    )
                    or 0
                )
                + 1
            )
            tx.execute(
                # due a look now: a wait for a node put its next look far off, and a report
                # that it ended must not take that look for one under way (make_due)
                "UPDATE attempts SET node_id = :n, fence = :f, node_gpus = :g, "
                "node_claimed_at = NULL, reconcile_due_at = :now WHERE id = :a",
                {"n": node_id, "f": fence, "g": gpus, "a": attempt_id, "now": utcnow()},
            )
            command_id = self._enqueue(
                tx,
                node_id,
                {**start, "fence": fence, "max_tasks": max_tasks},
                attempt_id=attempt_id,
            )
            run_id = tx.scalar("SELECT run_id FROM attempts WHERE id = :a", {"a": attempt_id})
            name = tx.scalar("SELECT name FROM nodes WHERE id = :n", {"n": node_id})
            append_event(
                tx,
                actor,
                "attempt.placed",
                run_id=run_id,
                attempt_id=attempt_id,
                node=name,
                fence=fence,
                gpus=list(gpus.get("indices", ())),
            )
        return fence, command_id

    def assign_gang(
        self,
        attempt_id: str,
        ranks: list[tuple[str, dict[str, Any], dict[str, Any]]],
        actor: str,
    ) -> list[str] | None:
        """Place a gang, all of it or none, in one transaction: rank 0 on the attempt itself,
        each other rank on a member attempt made here (`<attempt>.r<rank>`, following its
        leader's state), each node checked as assign_attempt checks one; `ranks` gives each
        rank's (node id, GPUs, start command). Every start carries fence 1 and its node's
        max_tasks. The attempt ids by rank, or None if a node has no room (the next pass
        places it again). Refused for an attempt already placed."""
        try:
            return self._assign_gang(attempt_id, ranks, actor)
        except _NoRoom:
            return None

    def _assign_gang(
        self,
        attempt_id: str,
        ranks: list[tuple[str, dict[str, Any], dict[str, Any]]],
        actor: str,
    ) -> list[str]:
        with self._write() as tx:
            if tx.dialect == "postgresql":
                for node_id in sorted({n for n, _, _ in ranks}):  # one order: no deadlock
                    tx.execute("SELECT id FROM nodes WHERE id = :id FOR UPDATE", {"id": node_id})
                tx.execute("SELECT id FROM attempts WHERE id = :a FOR UPDATE", {"a": attempt_id})
            leader = tx.one(
                "SELECT run_id, number, node_id, backend_key, target, state, handle "
                "FROM attempts WHERE id = :a",
                {"a": attempt_id},
            )
            if leader is None:
                raise NotFound(f"unknown attempt '{attempt_id}'")
            if leader["node_id"]:
                raise Refused(f"attempt {attempt_id} is already placed on a node")
            if leader["state"] != RunState.PREPARED.value or leader["handle"] is not None:
                # ended (cancelled, given up on) while a stalled launcher planned it: members
                # made now would run and hold their nodes with nobody to end them
                raise Refused(f"attempt {attempt_id} is {leader['state']}: not placed")
            ids = [attempt_id] + [f"{attempt_id}.r{rank}" for rank in range(1, len(ranks))]
            now = utcnow()
            names = []
            for rank, (node_id, gpus, start) in enumerate(ranks):
                max_tasks = _room(tx, node_id, attempt_id, gpus)
                if max_tasks is None:
                    raise _NoRoom  # rolls back the ranks placed so far: all or nothing
                member = ids[rank]
                if rank:
                    tx.execute(
                        "INSERT INTO attempts (id, run_id, number, rank, gang_of, state, target, "
                        'backend_key, "trigger", cancel_requested, created_at, updated_at) '
                        "VALUES (:id, :run, :number, :rank, :leader, :state, :target, :backend, "
                        "'gang', :no, :now, :now)",
                        {
                            "id": member,
                            "run": leader["run_id"],
                            "number": leader["number"],
                            "rank": rank,
                            "leader": attempt_id,
                            "state": RunState.SUBMITTED.value,
                            "target": leader["target"],
                            "backend": leader["backend_key"],
                            "no": False,
                            "now": now,
                        },
                    )
                tx.execute(
                    "UPDATE attempts SET node_id = :n, fence = 1, node_gpus = :g, "
                    "node_claimed_at = NULL, reconcile_due_at = :now WHERE id = :a",
                    {"n": node_id, "g": gpus, "a": member, "now": now},
                )
                body = {**start, "attempt_id": member, "fence": 1, "max_tasks": max_tasks}
                self._enqueue(tx, node_id, body, attempt_id=member)
                names.append(tx.scalar("SELECT name FROM nodes WHERE id = :n", {"n": node_id}))
            append_event(
                tx,
                actor,
                "attempt.placed",
                run_id=leader["run_id"],
                attempt_id=attempt_id,
                node=names[0],
                fence=1,
                gpus=list(ranks[0][1].get("indices", ())),
                gang=[{"rank": r, "attempt": ids[r], "node": names[r]} for r in range(len(ranks))],
            )
        return ids

    def claim_start(self, node_id: str, attempt_id: str, fence: int) -> tuple[bool, str]:
        """The fencing check an agent makes before it starts an attempt: granted to the node
        the attempt is placed on, under its current fence, while it has not ended. Asking
        again for the same placement is granted again (an answer lost on the way): the node
        itself never starts an attempt whose folder it has."""
        with self._write() as tx:
            granted = tx.execute(
                "UPDATE attempts SET node_claimed_at = COALESCE(node_claimed_at, :now) "
                "WHERE id = :a AND node_id = :n "
                f"AND fence = :f AND state IN {ACTIVE_IN}",
                {"now": utcnow(), "a": attempt_id, "n": node_id, "f": fence},
            )
            if granted == 1:
                return True, ""
            row = tx.one(
                "SELECT node_id, fence, node_claimed_at, state FROM attempts WHERE id = :a",
                {"a": attempt_id},
            )
        if row is None:
            return False, f"unknown attempt '{attempt_id}'"
        if row["node_id"] != node_id:
            return False, "the attempt is placed on another node"
        if row["fence"] != fence:
            return False, f"stale fence {fence} (the attempt's is {row['fence']})"
        if row["state"] not in ACTIVE_STATES:
            return False, f"the attempt has ended ({row['state']})"
        return False, "not granted"

    def gang_members(self, attempt_id: str) -> list[Row]:
        """A gang's ranks but 0: id, rank, node_id and its node's name, by rank."""
        with self._read() as tx:
            return tx.all(
                "SELECT a.id, a.rank, a.node_id, n.name FROM attempts a "
                "LEFT JOIN nodes n ON n.id = a.node_id WHERE a.gang_of = :a ORDER BY a.rank",
                {"a": attempt_id},
            )

    def node_attempts(self, node_id: str) -> list[Row]:
        """Its attempts that have not ended: id, fence, claimed, state."""
        with self._read() as tx:
            return tx.all(
                "SELECT id, run_id, fence, node_claimed_at, state FROM attempts "
                f"WHERE node_id = :n AND state IN {ACTIVE_IN}",
                {"n": node_id},
            )

    def attempt_placement(self, attempt_id: str) -> Row | None:
        with self._read() as tx:
            return tx.one(
                "SELECT node_id, fence, node_claimed_at, node_gpus, state FROM attempts "
                "WHERE id = :a",
                {"a": attempt_id},
            )

    # --- commands ------------------------------------------------------------------------------

    @staticmethod
    def _enqueue(
        tx: Tx,
        node_id: str,
        body: dict[str, Any],
        attempt_id: str | None,
        command_id: str | None = None,
    ) -> str:
        command_id = command_id or f"cmd-{uuid.uuid4().hex}"
        tx.execute(
            "INSERT INTO node_commands (id, node_id, kind, attempt_id, body, created_at) "
            "VALUES (:id, :n, :kind, :a, :body, :now)",
            {
                "id": command_id,
                "n": node_id,
                "kind": body["kind"],
                "a": attempt_id,
                "body": body,
                "now": utcnow(),
            },
        )
        return command_id

    def enqueue_command(
        self,
        node_id: str,
        body: dict[str, Any],
        attempt_id: str | None = None,
        command_id: str | None = None,
    ) -> str:
        with self._write() as tx:
            return self._enqueue(tx, node_id, body, attempt_id, command_id)

    def pending_commands(self, node_id: str) -> list[Row]:
        with self._read() as tx:
            return tx.all(
                "SELECT seq, id, body FROM node_commands WHERE node_id = :n AND acked_at IS NULL "
                "ORDER BY seq",
                {"n": node_id},
            )

    def pending_nodes(self, after_seq: int) -> tuple[set[str], int]:
        """Nodes with commands queued after `after_seq`, and the newest seq (one query a
        second wakes the long-polls of every node whose queue another process filled)."""
        with self._read() as tx:
            rows = tx.all(
                "SELECT node_id, max(seq) AS top FROM node_commands "
                "WHERE seq > :s AND acked_at IS NULL GROUP BY node_id",
                {"s": after_seq},
            )
        top = max((int(r["top"]) for r in rows), default=after_seq)
        return {r["node_id"] for r in rows}, top

    def ack_commands(self, node_id: str, ids: list[str]) -> list[str]:
        """Acknowledge commands; the ids this node was never sent (a mismatch)."""
        if not ids:
            return []
        unknown = []
        with self._write() as tx:
            for command_id in ids:
                row = tx.one("SELECT node_id FROM node_commands WHERE id = :id", {"id": command_id})
                if row is None or row["node_id"] != node_id:
                    unknown.append(command_id)
                    continue
                tx.execute(
                    "UPDATE node_commands SET acked_at = :now WHERE id = :id AND acked_at IS NULL",
                    {"now": utcnow(), "id": command_id},
                )
        return unknown

    def drop_commands(self, node_id: str, keep_kinds: tuple[str, ...] = ()) -> int:
        """Drop a node's pending queue (a resync rebuilds it from what the store knows)."""
        kinds = "(" + ", ".join(f"'{k}'" for k in keep_kinds) + ")" if keep_kinds else None
        with self._write() as tx:
            return tx.execute(
                "UPDATE node_commands SET acked_at = :now WHERE node_id = :n AND acked_at IS NULL"
                + (f" AND kind NOT IN {kinds}" if kinds else ""),
                {"now": utcnow(), "n": node_id},
            )

    def finish_command(self, command_id: str, node_id: str, result: dict[str, Any]) -> bool:
        with self._write() as tx:
            return (
                tx.execute(
                    "UPDATE node_commands SET done_at = :now, result = :r, "
                    "acked_at = COALESCE(acked_at, :now) "
                    "WHERE id = :id AND node_id = :n AND done_at IS NULL",
                    {"now": utcnow(), "r": result, "id": command_id, "n": node_id},
                )
                == 1
            )

    def command_result(self, command_id: str) -> dict[str, Any] | None:
        """A finished command's result; None while it is not done."""
        with self._read() as tx:
            row = tx.one(
                "SELECT done_at, result FROM node_commands WHERE id = :id", {"id": command_id}
            )
        if row is None:
            raise NotFound(f"unknown command '{command_id}'")
        return None if row["done_at"] is None else (read_json(row["result"]) or {})


class _NoRoom(Exception):
    """A gang's node had no room: its transaction is rolled back."""


def _room(tx: Tx, node_id: str, attempt_id: str, gpus: dict[str, Any]) -> int | None:
    """The node's max_tasks if it takes work and has a slot and the GPUs for the attempt
    (`gpus`, as placed) now, else None."""
    node = tx.one("SELECT state, max_tasks FROM nodes WHERE id = :n", {"n": node_id})
    if node is None or node["state"] != "active":
        return None
    max_tasks = int(node["max_tasks"])
    busy = tx.scalar(
        f"SELECT count(*) FROM attempts WHERE node_id = :n AND state IN {ACTIVE_IN} AND id <> :a",
        {"n": node_id, "a": attempt_id},
    )
    if busy >= max_tasks or not _gpus_free(tx, node_id, attempt_id, gpus):
        return None
    return max_tasks


def _gpus_free(tx: Tx, node_id: str, attempt_id: str, gpus: dict[str, Any]) -> bool:
    """Whether the GPUs a placement asks for are still free on the node (whole), or still
    have room for its reservation: a plan made before another placement took them is
    refused, not committed over it."""
    want = [int(i) for i in gpus.get("indices", ())]
    if not want:
        return True
    held: dict[int, float] = {}
    for row in tx.all(
        f"SELECT node_gpus FROM attempts WHERE node_id = :n AND state IN {ACTIVE_IN} "
        "AND id <> :a AND node_gpus IS NOT NULL",
        {"n": node_id, "a": attempt_id},
    ):
        placed = read_json(row["node_gpus"]) or {}
        per = float(placed.get("memory_gb", 0.0) or 0.0)
        for index in placed.get("indices", ()):
            held[int(index)] = float("inf") if per == 0 else held.get(int(index), 0.0) + per
    share = float(gpus.get("memory_gb", 0.0) or 0.0)
    totals = gpus.get("gpu_gb") or {}
    for index in want:
        if not share and index in held:
            return False
        if share and held.get(index, 0.0) + share > float(totals.get(str(index), float("inf"))):
            return False
    return True
