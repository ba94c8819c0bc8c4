"""The scheduler config last seen valid, in the store: one row, replaced by a compare-and-set
on its digest with the audit event of the change (who, the source, the diff) in the same
transaction, so that of several replicas that see one edit of the file, one records it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from orbit.store.audit import append_event
from orbit.store.base import Part, utcnow
from orbit.store.sql import read_time_required

ROW = 1


@dataclass(frozen=True)
class StoredConfig:
    text: str
    digest: str
    source: str
    set_at: datetime
    set_by: str


class SchedConfigTable(Part):
    def get(self) -> StoredConfig | None:
        with self._read() as tx:
            row = tx.one(
                "SELECT text, digest, source, set_at, set_by FROM sched_config WHERE id = :id",
                {"id": ROW},
            )
        if row is None:
            return None
        return StoredConfig(
            text=row["text"],
            digest=row["digest"],
            source=row["source"],
            set_at=read_time_required(row["set_at"]),
            set_by=row["set_by"],
        )

    def replace(
        self,
        text: str,
        digest: str,
        source: str,
        actor: str,
        *,
        was: str | None,
        how: str,
        diff: str,
    ) -> bool:
        """Keep `text` as the live config if the stored one is still `was` (a digest; None:
        none stored yet), audited as `sched.config` with `how` (set, edited, removed) and
        `diff`. False if another process replaced it first (or it is already this one):
        nothing is written then."""
        at = utcnow()
        values = {"id": ROW, "text": text, "d": digest, "s": source, "at": at, "by": actor}
        with self._write() as tx:
            if was is None:
                if not tx.execute(
                    "INSERT INTO sched_config (id, text, digest, source, set_at, set_by) "
                    "VALUES (:id, :text, :d, :s, :at, :by) ON CONFLICT (id) DO NOTHING",
                    values,
                ):
                    return False
            elif not tx.execute(
                "UPDATE sched_config SET text = :text, digest = :d, source = :s, "
                "set_at = :at, set_by = :by WHERE id = :id AND digest = :was AND digest <> :d",
                {**values, "was": was},
            ):
                return False
            append_event(
                tx, actor, "sched.config", how=how, source=source, digest=digest, was=was, diff=diff
            )
        return True
