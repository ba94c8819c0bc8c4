"""Storage in the store: a run's marks (pinned, deleted, its artifacts expired), what was removed
of an attempt's files, the measured sizes of copies that no longer change, the gc loop's turn,
and the reads gc and usage make. Every mark and removal is audited in its own transaction."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from orbit.model.storage import Removal, RunStorage
from orbit.store.attempt_states import ACTIVE_IN
from orbit.store.audit import append_event
from orbit.store.base import Part, utcnow
from orbit.store.node_commands import enqueue
from orbit.store.sql import Row, Tx, expand, read_time

MARK_COLUMNS = "pinned, pinned_by, pinned_at, deleted_at, deleted_by, expired_at"
NOT_GONE = "rs.deleted_at IS NULL AND rs.expired_at IS NULL"
# a run's attempts with their node; members of a gang included (each has its own copy)
ATTEMPT_COLUMNS = "a.id, a.run_id, a.backend_key, a.state, a.node_id, a.number, n.name AS node"
ATTEMPTS_FROM = "attempts a LEFT JOIN nodes n ON n.id = a.node_id"


def run_storage(row: Row | None) -> RunStorage:
    if row is None:
        return RunStorage()
    return RunStorage(
        pinned=bool(row["pinned"]),
        pinned_by=row["pinned_by"],
        pinned_at=read_time(row["pinned_at"]),
        deleted_at=read_time(row["deleted_at"]),
        deleted_by=row["deleted_by"],
        expired_at=read_time(row["expired_at"]),
    )


class StorageTable(Part):
    # --- marks -----------------------------------------------------------------------------

    def marks(self, run_id: str) -> RunStorage:
        with self._read() as tx:
            return self._marks(tx, run_id)

    @staticmethod
    def _marks(tx: Tx, run_id: str) -> RunStorage:
        row = tx.one(f"SELECT {MARK_COLUMNS} FROM run_storage WHERE run_id = :r", {"r": run_id})
        return run_storage(row)

    def pin(self, run_id: str, pinned: bool, actor: str) -> RunStorage:
        """Pin or unpin (audited when it changes anything); the marks after."""
        with self._write() as tx:
            if self._marks(tx, run_id).pinned == pinned:
                return self._marks(tx, run_id)
            self._upsert(
                tx,
                run_id,
                pinned=pinned,
                pinned_by=actor if pinned else None,
                pinned_at=utcnow() if pinned else None,
            )
            append_event(tx, actor, "run.pinned" if pinned else "run.unpinned", run_id=run_id)
            return self._marks(tx, run_id)

    @staticmethod
    def _upsert(tx: Tx, run_id: str, **values: Any) -> None:
        names = ", ".join(values)
        params = ", ".join(f":{k}" for k in values)
        updates = ", ".join(f"{k} = excluded.{k}" for k in values)
        tx.execute(
            f"INSERT INTO run_storage (run_id, {names}) VALUES (:run_id, {params}) "
            f"ON CONFLICT (run_id) DO UPDATE SET {updates}",
            {"run_id": run_id, **values},
        )

    def mark_gone(
        self, run_id: str, why: str, actor: str, removals: Sequence[Removal], **data: Any
    ) -> None:
        """A run deleted (`deleted`) or its artifacts expired (`expired`), with what that
        removes (recorded, node removals queued to their agents) and its audit event, in one
        transaction: written before the files go, so that a removal cut short is finished
        by the next gc pass."""
        at = utcnow()
        with self._write() as tx:
            if why == "deleted":
                self._upsert(tx, run_id, deleted_at=at, deleted_by=actor)
            else:
                self._upsert(tx, run_id, expired_at=at)
            self._record(tx, removals, at)
            total = sum(r.bytes for r in removals)
            append_event(tx, actor, f"run.{why}", run_id=run_id, bytes=total, **data)

    def record_removals(self, removals: Sequence[Removal], actor: str, action: str) -> None:
        """Removals of a gc pass that are not a whole run's (checkpoints, bundles, orphans):
        recorded, node removals queued, one audit event per run (or one for the rest)."""
        if not removals:
            return
        by_run: dict[str | None, list[Removal]] = {}
        for removal in removals:
            by_run.setdefault(removal.run_id, []).append(removal)
        at = utcnow()
        with self._write() as tx:
            self._record(tx, removals, at)
            for run_id, some in by_run.items():
                append_event(
                    tx,
                    actor,
                    action,
                    run_id=run_id,
                    bytes=sum(r.bytes for r in some),
                    removed=[f"{r.where}: {r.path}" for r in some],
                )

    @staticmethod
    def _record(tx: Tx, removals: Sequence[Removal], at: datetime) -> None:
        nodes: dict[str, list[str]] = {}
        for r in removals:
            if r.run_id is not None and r.attempt_id is not None:
                tx.execute(
                    "INSERT INTO artifact_removals "
                    "(run_id, attempt_id, path, bytes, files, why, at) "
                    "VALUES (:run, :attempt, :path, :bytes, :files, :why, :at)",
                    {
                        "run": r.run_id,
                        "attempt": r.attempt_id,
                        "path": r.relpath or "",
                        "bytes": r.bytes,
                        "files": r.files,
                        "why": r.why,
                        "at": at,
                    },
                )
            if r.where.startswith("node ") and r.attempt_id is not None:
                node_id = tx.scalar(
                    "SELECT node_id FROM attempts WHERE id = :a", {"a": r.attempt_id}
                )
                if node_id is not None:
                    nodes.setdefault(str(node_id), []).append(r.attempt_id)
        for node_id, attempts in nodes.items():
            body = {"kind": "remove", "attempt_ids": sorted(set(attempts))}
            enqueue(tx, node_id, body, None)

    def removed_paths(self, attempt_id: str) -> list[tuple[str, str, datetime]]:
        """(path under artifacts/, '' for all of them; why; when) of what was removed."""
        with self._read() as tx:
            rows = tx.all(
                "SELECT path, why, at FROM artifact_removals WHERE attempt_id = :a ORDER BY id",
                {"a": attempt_id},
            )
        return [(r["path"], r["why"], read_time(r["at"]) or utcnow()) for r in rows]

    # --- measured sizes --------------------------------------------------------------------

    def sizes(self) -> dict[str, tuple[int, int]]:
        with self._read() as tx:
            rows = tx.all("SELECT key, bytes, files FROM storage_sizes")
        return {r["key"]: (int(r["bytes"]), int(r["files"])) for r in rows}

    def save_sizes(self, sizes: dict[str, tuple[int, int]]) -> None:
        if not sizes:
            return
        with self._write() as tx:
            for key, (size, files) in sizes.items():
                tx.execute(
                    "INSERT INTO storage_sizes (key, bytes, files, measured_at) "
                    "VALUES (:k, :b, :f, :at) ON CONFLICT (key) DO UPDATE SET "
                    "bytes = excluded.bytes, files = excluded.files, "
                    "measured_at = excluded.measured_at",
                    {"k": key, "b": size, "f": files, "at": utcnow()},
                )

    def forget_sizes(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        placeholders, params = expand("k", list(keys))
        with self._write() as tx:
            tx.execute(f"DELETE FROM storage_sizes WHERE key IN ({placeholders})", params)

    # --- the gc loop's turn ----------------------------------------------------------------

    def claim_gc(self, holder: str, at: datetime, next_due: datetime) -> bool:
        """Whether this replica runs the pass due now (one compare-and-set: replicas never
        run one pass twice); the next is then due at `next_due`."""
        with self._write() as tx:
            tx.execute(
                "INSERT INTO storage_gc (id, due_at) VALUES (1, :at) ON CONFLICT (id) DO NOTHING",
                {"at": at},
            )
            changed = tx.execute(
                "UPDATE storage_gc SET due_at = :next, ran_at = :at, holder = :h "
                "WHERE id = 1 AND due_at <= :at",
                {"next": next_due, "at": at, "h": holder},
            )
        return changed == 1

    def last_gc(self) -> datetime | None:
        with self._read() as tx:
            return read_time(tx.scalar("SELECT ran_at FROM storage_gc WHERE id = 1"))

    # --- what gc and usage read ------------------------------------------------------------

    def attempts_for_usage(self) -> Iterator[Row]:
        """Every attempt with its run's user and experiment, and whether the run is gone."""
        with self._read() as tx:
            yield from tx.stream(
                "SELECT a.id, a.run_id, a.backend_key, a.state, r.created_by AS user_name, "
                "e.name AS experiment, rs.deleted_at, rs.expired_at "
                "FROM attempts a JOIN runs r ON r.id = a.run_id "
                "JOIN experiments e ON e.id = r.experiment_id "
                "LEFT JOIN run_storage rs ON rs.run_id = r.id"
            )

    def bundle_owners(self) -> dict[str, tuple[str, str]]:
        """digest -> (user, experiment) of the oldest run not deleted that uses it: what a
        bundle counts towards. A digest missing here is referenced by no live run."""
        owners: dict[str, tuple[str, str]] = {}
        with self._read() as tx:
            for row in tx.stream(
                "SELECT r.bundle_digest, r.created_by, e.name FROM runs r "
                "JOIN experiments e ON e.id = r.experiment_id "
                "LEFT JOIN run_storage rs ON rs.run_id = r.id "
                "WHERE rs.deleted_at IS NULL ORDER BY r.created_at DESC, r.id DESC"
            ):
                owners[row["bundle_digest"]] = (row["created_by"], row["name"])
        return owners

    def bundle_users(self, digest: str) -> list[Row]:
        """Runs not deleted that use the bundle, with the state of their current attempt."""
        with self._read() as tx:
            return tx.all(
                "SELECT r.id, (SELECT count(*) FROM attempts a WHERE a.run_id = r.id "
                f"AND a.state IN {ACTIVE_IN}) AS active FROM runs r "
                "LEFT JOIN run_storage rs ON rs.run_id = r.id "
                "WHERE r.bundle_digest = :d AND rs.deleted_at IS NULL",
                {"d": digest},
            )

    def ended_runs(self, before: datetime) -> list[Row]:
        """Runs neither pinned nor gone whose attempts all ended before `before`: id,
        experiment and when the last one ended."""
        with self._read() as tx:
            return tx.all(
                "SELECT r.id, e.name AS experiment, "
                "max(coalesce(a.finished_at, a.updated_at)) AS ended_at "
                "FROM runs r JOIN experiments e ON e.id = r.experiment_id "
                "JOIN attempts a ON a.run_id = r.id "
                "LEFT JOIN run_storage rs ON rs.run_id = r.id "
                f"WHERE (rs.run_id IS NULL OR (NOT rs.pinned AND {NOT_GONE})) "
                f"AND NOT EXISTS (SELECT 1 FROM attempts b WHERE b.run_id = r.id "
                f"AND b.state IN {ACTIVE_IN}) "
                "GROUP BY r.id, e.name HAVING max(coalesce(a.finished_at, a.updated_at)) < :before",
                {"before": before},
            )

    def live_runs(self, since: datetime | None) -> list[Row]:
        """Runs neither pinned nor gone (with `since`: only those active, or whose attempts
        changed since then): id, experiment, whether one of their attempts is active."""
        recent = "" if since is None else f" AND (a.updated_at >= :since OR a.state IN {ACTIVE_IN})"
        with self._read() as tx:
            return tx.all(
                "SELECT r.id, e.name AS experiment, "
                f"max(CASE WHEN a.state IN {ACTIVE_IN} THEN 1 ELSE 0 END) AS active "
                "FROM runs r JOIN experiments e ON e.id = r.experiment_id "
                "JOIN attempts a ON a.run_id = r.id "
                "LEFT JOIN run_storage rs ON rs.run_id = r.id "
                f"WHERE (rs.run_id IS NULL OR (NOT rs.pinned AND {NOT_GONE})){recent} "
                "GROUP BY r.id, e.name",
                {"since": since},
            )

    def attempts_of(self, run_ids: Sequence[str]) -> list[Row]:
        """The attempts of these runs (gang members too), with their node's name."""
        if not run_ids:
            return []
        placeholders, params = expand("r", list(run_ids))
        with self._read() as tx:
            return tx.all(
                f"SELECT {ATTEMPT_COLUMNS} FROM {ATTEMPTS_FROM} WHERE a.run_id IN ({placeholders}) "
                "ORDER BY a.number, a.rank",
                params,
            )

    def gone_attempts(self) -> list[Row]:
        """The attempts of runs deleted or expired (whose files should be gone)."""
        with self._read() as tx:
            return tx.all(
                f"SELECT {ATTEMPT_COLUMNS}, rs.deleted_at FROM {ATTEMPTS_FROM} "
                "JOIN run_storage rs ON rs.run_id = a.run_id "
                "WHERE rs.deleted_at IS NOT NULL OR rs.expired_at IS NOT NULL"
            )

    def known_attempts(self, ids: Sequence[str]) -> set[str]:
        found: set[str] = set()
        for start in range(0, len(ids), 500):
            placeholders, params = expand("a", list(ids[start : start + 500]))
            with self._read() as tx:
                rows = tx.all(f"SELECT id FROM attempts WHERE id IN ({placeholders})", params)
            found.update(r["id"] for r in rows)
        return found
