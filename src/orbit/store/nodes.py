"""Nodes and their join tokens in the store: a node joins with a token, is found by its
credential, name or id (with the attempts it runs and the GPUs they hold), is changed or removed
by an admin.

Credentials and join tokens are kept as sha256 hashes only. Every change a person makes is
audited; an agent's traffic (heartbeats, acks: orbit.store.node_heartbeats,
orbit.store.node_commands) is not: the audit records who placed, started, cancelled or lost an
attempt, not each poll."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from orbit.model.errors import InvalidInput, NotFound, Refused
from orbit.model.nodes import JoinTokenRecord, NodeRecord, NodeState
from orbit.store.attempt_leases import wake_waiting_for_nodes
from orbit.store.attempt_states import ACTIVE_IN
from orbit.store.audit import append_event
from orbit.store.base import Part, new_id, utcnow
from orbit.store.drivers import Conflict
from orbit.store.sql import Row, Tx, read_json, read_time, read_time_required

NODE_COLUMNS = (
    "id, name, labels, info, state, max_tasks, created_at, created_by, last_seen_at, session, "
    "report_seq, preempted_at, reason, reason_by, reason_at"
)
JOIN_COLUMNS = "id, labels, created_at, created_by, expires_at, revoked_at, uses"


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


def node_records(tx: Tx, rows: list[Row]) -> list[NodeRecord]:
    """The nodes of `rows`, each with the attempts it runs and the GPU memory they hold."""
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
            reason=r["reason"],
            reason_by=r["reason_by"],
            reason_at=read_time(r["reason_at"]),
        )
        for r in rows
    ]


class Nodes(Part):
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
            return node_records(tx, rows)

    def _node(self, tx: Tx, row: Row) -> NodeRecord:
        return node_records(tx, [row])[0]

    def update_node(
        self,
        ref: str,
        actor: str,
        *,
        state: NodeState | None = None,
        max_tasks: int | None = None,
        reason: str | None = None,
        clear_reason: bool = False,
    ) -> NodeRecord:
        """Change a node's state or max_tasks, and give (`reason`) or clear (`clear_reason`)
        why it is out of service; audited as node.update with what changed."""
        node = self.get_node(ref)
        values: dict[str, Any] = {}
        if state is not None and state is not node.state:
            if node.state is NodeState.REVOKED:
                raise Refused(f"node '{node.name}' is revoked: remove it and let it join again")
            values["state"] = state.value
        if max_tasks is not None and max_tasks != node.max_tasks:
            values["max_tasks"] = max_tasks
        said = dict(values)
        if reason is not None or (clear_reason and node.reason is not None):
            at = utcnow() if reason is not None else None
            values.update(reason=reason, reason_by=actor if at else None, reason_at=at)
            said["reason"] = reason
        if values:
            sets = ", ".join(f"{k} = :{k}" for k in values)
            with self._write() as tx:
                tx.execute(f"UPDATE nodes SET {sets} WHERE id = :id", {**values, "id": node.id})
                append_event(tx, actor, "node.update", node=node.name, **said)
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
