"""Each node's command queue in the store: commands queued for an agent (starts, stops,
removals, file transfers), handed out, acknowledged, dropped for a resync, and their results.
An agent's acks and results are not audited (the audit records who placed, started,
cancelled or lost an attempt, not each poll)."""

from __future__ import annotations

import uuid
from typing import Any

from orbit.model.errors import NotFound
from orbit.store.base import Part, utcnow
from orbit.store.sql import Row, Tx, read_json


def enqueue(
    tx: Tx,
    node_id: str,
    body: dict[str, Any],
    attempt_id: str | None,
    command_id: str | None = None,
) -> str:
    """Queue a command for the node, in the caller's transaction; its id."""
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


class NodeCommands(Part):
    def enqueue_command(
        self,
        node_id: str,
        body: dict[str, Any],
        attempt_id: str | None = None,
        command_id: str | None = None,
    ) -> str:
        with self._write() as tx:
            return enqueue(tx, node_id, body, attempt_id, command_id)

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

    def transfer_open(self, node_id: str, command_id: str, kind: str) -> bool:
        """Whether `command_id` is a file transfer of `kind` queued for this node and not done:
        the only ids a node may name in a transfer (they become file names here)."""
        with self._read() as tx:
            return (
                tx.one(
                    "SELECT 1 AS found FROM node_commands WHERE id = :id AND node_id = :n "
                    "AND kind = :k AND done_at IS NULL",
                    {"id": command_id, "n": node_id, "k": kind},
                )
                is not None
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
