"""Alerts in the store: one open alert per key while its condition holds (a unique index on
the open ones' keys, so that two replicas raise it once), resolved when it stops holding;
acknowledged and silenced by name. Raising, resolving, acknowledging and silencing are audit
events."""

from __future__ import annotations

from datetime import datetime

from orbit.model.alerts import AlertRecord, Firing
from orbit.model.errors import NotFound
from orbit.model.states import RunState
from orbit.store.audit import append_event
from orbit.store.base import Part, utcnow
from orbit.store.drivers import Conflict
from orbit.store.sql import Row, expand, read_json, read_time, read_time_required

COLUMNS = (
    "id, alert_key, kind, severity, objects, message, remedy, raised_at, resolved_at, "
    "acked_by, acked_at, silenced_until"
)


def _record(row: Row) -> AlertRecord:
    return AlertRecord(
        id=row["id"],
        key=row["alert_key"],
        kind=row["kind"],
        severity=row["severity"],
        objects=read_json(row["objects"]),
        message=row["message"],
        remedy=row["remedy"],
        raised_at=read_time_required(row["raised_at"]),
        resolved_at=read_time(row["resolved_at"]),
        acked_by=row["acked_by"],
        acked_at=read_time(row["acked_at"]),
        silenced_until=read_time(row["silenced_until"]),
    )


class Alerts(Part):
    def sync(self, firing: list[Firing]) -> tuple[list[AlertRecord], list[AlertRecord]]:
        """Raise what fires and has no open alert; resolve the open ones that no longer fire.
        (raised, resolved): what this call changed (another replica's changes are not in it)."""
        raised: list[int] = []
        resolved: list[AlertRecord] = []
        now = utcnow()
        wanted = {f.key: f for f in firing}
        with self._read() as tx:
            open_rows = tx.all(f"SELECT {COLUMNS} FROM alerts WHERE resolved_at IS NULL", {})
        have = {r["alert_key"]: r for r in open_rows}
        for key, row in have.items():
            if key in wanted:
                continue
            with self._write() as tx:
                done = tx.execute(
                    "UPDATE alerts SET resolved_at = :now WHERE id = :id AND resolved_at IS NULL",
                    {"now": now, "id": row["id"]},
                )
                if done:
                    append_event(tx, "orbit", "alert.resolved", alert=row["id"], key=key)
            if done:
                resolved.append(_record({**row, "resolved_at": now}))
        for key, fire in wanted.items():
            if key in have:
                continue
            try:
                with self._write() as tx:
                    tx.execute(
                        "INSERT INTO alerts (alert_key, kind, severity, objects, message, remedy, "
                        "raised_at) VALUES (:key, :kind, :severity, :objects, :message, :remedy, "
                        ":now)",
                        {"key": key, "kind": fire.kind, "severity": fire.severity,
                         "objects": fire.objects, "message": fire.message, "remedy": fire.remedy,
                         "now": now},
                    )  # fmt: skip
                    made = tx.scalar(
                        "SELECT id FROM alerts WHERE alert_key = :key AND resolved_at IS NULL",
                        {"key": key},
                    )
                    append_event(
                        tx, "orbit", "alert.raised", alert=made, key=key, severity=fire.severity,
                        message=fire.message,
                    )  # fmt: skip
                raised.append(int(made))
            except Conflict:  # another replica raised it first
                continue
        return [self.get(i) for i in raised], resolved

    def list_alerts(self, include_resolved: bool = False, limit: int = 500) -> list[AlertRecord]:
        where = "" if include_resolved else "WHERE resolved_at IS NULL"
        with self._read() as tx:
            rows = tx.all(
                f"SELECT {COLUMNS} FROM alerts {where} ORDER BY id DESC LIMIT :n", {"n": limit}
            )
        return [_record(r) for r in rows]

    def get(self, alert_id: int) -> AlertRecord:
        with self._read() as tx:
            row = tx.one(f"SELECT {COLUMNS} FROM alerts WHERE id = :id", {"id": alert_id})
        if row is None:
            raise NotFound(f"unknown alert {alert_id} (see 'orbit alerts list --all')")
        return _record(row)

    def acknowledge(self, alert_id: int, actor: str) -> AlertRecord:
        self.get(alert_id)
        with self._write() as tx:
            tx.execute(
                "UPDATE alerts SET acked_by = :by, acked_at = :at WHERE id = :id",
                {"by": actor, "at": utcnow(), "id": alert_id},
            )
            append_event(tx, actor, "alert.acknowledged", alert=alert_id)
        return self.get(alert_id)

    def silence(self, alert_id: int, until: datetime, actor: str) -> AlertRecord:
        self.get(alert_id)
        with self._write() as tx:
            tx.execute(
                "UPDATE alerts SET silenced_until = :until WHERE id = :id",
                {"until": until, "id": alert_id},
            )
            append_event(tx, actor, "alert.silenced", alert=alert_id, until=until.isoformat())
        return self.get(alert_id)

    def waiting_runs(self, before: datetime) -> list[tuple[str, str, datetime]]:
        """(run, user, since) of the runs whose current attempt is not placed yet, made before
        `before` (by the runs' state index); not those held on a run they wait for (`after:`)
        that has not ended."""
        with self._read() as tx:
            rows = tx.all(
                "SELECT r.id, r.created_by, a.created_at FROM runs r JOIN attempts a ON "
                "a.run_id = r.id AND a.rank = 0 AND a.number = (SELECT MAX(number) FROM "
                "attempts b WHERE b.run_id = r.id AND b.rank = 0) WHERE r.state = 'prepared' "
                "AND r.created_at < :before AND a.created_at < :before AND NOT EXISTS (SELECT 1 "
                "FROM run_dependencies d JOIN runs n ON n.id = d.needs WHERE d.run_id = r.id "
                "AND n.state NOT IN ('succeeded', 'failed', 'terminated'))",
                {"before": before},
            )
        return [(r["id"], r["created_by"], read_time_required(r["created_at"])) for r in rows]

    def retried_runs(self, over: int) -> list[tuple[str, str, int]]:
        """(run, user, attempts) of the runs not ended on more attempts than `over`."""
        # the states not ended, named: NOT IN reads every run (117 ms at 100,000 runs on
        # SQLite, each look of the alert loop), IN finds them by the state's index (0.1 ms)
        placeholders, states = expand("state", [s.value for s in RunState if not s.terminal])
        with self._read() as tx:
            rows = tx.all(
                "SELECT r.id, r.created_by, COUNT(a.id) AS attempts FROM runs r JOIN attempts a "
                f"ON a.run_id = r.id AND a.rank = 0 WHERE r.state IN ({placeholders}) "
                "GROUP BY r.id, r.created_by HAVING COUNT(a.id) > :over",
                {**states, "over": over},
            )
        return [(r["id"], r["created_by"], int(r["attempts"])) for r in rows]
