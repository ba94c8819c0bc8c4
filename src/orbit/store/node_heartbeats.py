"""What an agent's traffic tells the store of its node: when it was last heard (one
heartbeat or many at once), the facts it reports, its session and which of its reports were
applied. Not audited: the audit records what people and the planes decide, not each poll."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orbit.store.base import Part, utcnow


class NodeHeartbeats(Part):
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
