"""A gc pass: retention rules applied, and what nothing refers to any more removed.

In order: the artifacts of runs that ended more than their experiment's `artifacts_days` ago
(each attempt's copy on the server, and on its node, where its agent removes it when told);
all but the newest `keep_checkpoints` checkpoints of each run (never one a retry would resume
from while the run is active, never one still being written); what is left of runs deleted
or expired (a removal cut short); bundles no run refers to any more (a deleted run does not);
and what no record refers to at all (the old collect cache, folders of no attempt), once it
is older than ORPHAN_GRACE_S (a submit freezes its bundle before its run is written).

Pinned runs are never touched. Each run's removals are written to the store (audited) before
its files go, so a pass cut short is finished by the next. A dry run says what would go."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

from orbit.core.control.copies import Places
from orbit.core.storage import disk
from orbit.core.storage.checkpoints import Checkpoint, checkpoints, resume_point, surplus
from orbit.model.models import RunState
from orbit.model.retention import DAY_S, Retention
from orbit.model.storage import GcReport, Removal, Why
from orbit.store import Store
from orbit.store.sql import Row, read_time

ORPHAN_GRACE_S = 3600.0
FREED = "storage.removed"  # the audit action of removals that are not a whole run's
HELD_BUNDLE = re.compile(rb'^\{"bundle": "([0-9a-f]{64})"')  # a held inputs entry's start


class GcPass:
    def __init__(
        self,
        store: Store,
        places: Places,
        actor: str,
        rules: Retention,
        *,
        dry_run: bool = False,
        since: datetime | None = None,
        now: datetime,
    ) -> None:
        """`since`: look for surplus checkpoints only in runs active or changed since then
        (the server's loop); None: in every run (`orbit gc`)."""
        self.store, self.places, self.actor, self.rules = store, places, actor, rules
        self.dry_run, self.since, self.now = dry_run, since, now
        self.removals: list[Removal] = []

    def run(self) -> GcReport:
        self.expire_runs()
        self.trim_checkpoints()
        self.finish_gone()
        self.drop_bundles()
        self.drop_orphans()
        return GcReport.of(self.removals, dry_run=self.dry_run)

    # --- retention ---------------------------------------------------------------------------

    def expire_runs(self) -> None:
        days = [r.artifacts_days for r in (self.rules, *self.rules.experiments.values())]
        known = [d for d in days if d is not None]
        if not known:
            return
        loosest = self.now - timedelta(seconds=min(known) * DAY_S)
        for row in self.store.storage.ended_runs(loosest):
            limit = self.rules.for_experiment(row["experiment"]).artifacts_days
            ended = read_time(row["ended_at"])
            if limit is None or ended is None or ended >= self.now - timedelta(days=limit):
                continue
            removals = run_removals(self.store, self.places, [row["id"]], "expired")
            self.removals += removals
            if not self.dry_run:
                self.store.storage.mark_gone(
                    row["id"], "expired", self.actor, removals, artifacts_days=limit
                )
                remove_here(self.store, removals, self.places.home)

    def trim_checkpoints(self) -> None:
        if all(r.keep_checkpoints is None for r in (self.rules, *self.rules.experiments.values())):
            return
        rows = self.store.storage.live_runs(self.since)
        kept = {r["id"]: self.rules.for_experiment(r["experiment"]).keep_checkpoints for r in rows}
        wanted = [r for r in rows if kept[r["id"]] is not None]
        for start in range(0, len(wanted), 200):
            some = wanted[start : start + 200]
            attempts = self.store.storage.attempts_of([r["id"] for r in some])
            for row in some:
                mine = [a for a in attempts if a["run_id"] == row["id"]]
                keep = kept[row["id"]]
                assert keep is not None
                removals = self._surplus(row["id"], mine, keep, bool(row["active"]))
                self._done(removals, "run.checkpoints_removed")

    def _surplus(self, run_id: str, attempts: list[Row], keep: int, active: bool) -> list[Removal]:
        found: list[Checkpoint] = []
        protected: set[tuple[str, str]] = set()
        folders: dict[str, Path] = {}
        for a in attempts:
            folder = self.places.attempt_copy(a["id"], a["backend_key"]) / "artifacts"
            folders[a["id"]] = folder
            found += checkpoints(folder, a["id"])
            point = resume_point(folder) if active else None
            if point is not None:  # what a retry of the active run would resume from
                protected.add((a["id"], point))
        running = {a["id"] for a in attempts if not RunState(a["state"]).terminal}
        removals = []
        for c in surplus(found, keep, protected, running, now=time.time()):
            path = folders[c.attempt_id] / c.relpath
            size, files = disk.measure(path)
            removals.append(
                Removal(
                    kind="checkpoint",
                    why="checkpoints",
                    where="server",
                    path=self._shown(path),
                    relpath=c.relpath,
                    bytes=size,
                    files=files,
                    run_id=run_id,
                    attempt_id=c.attempt_id,
                )
            )
        return removals

    # --- what nothing refers to ------------------------------------------------------------

    def finish_gone(self) -> None:
        """Copies of deleted or expired runs still there (a removal cut short, an upload that
        came after it): removed."""
        removals = []
        for a in self.store.storage.gone_attempts():
            folder = self.places.attempt_copy(a["id"], a["backend_key"])
            if folder.exists():
                why: Why = "deleted" if a["deleted_at"] is not None else "expired"
                removals.append(self._whole(folder, "attempt", why, a["run_id"], a["id"]))
        self._done(removals, FREED)

    def drop_bundles(self) -> None:
        owners = self.store.storage.bundle_owners()
        removals = []
        for folder in _entries(self.places.bundles):
            if folder.name not in owners and self._old(folder):
                removals.append(self._whole(folder, "bundle", "unreferenced"))
        for archive in _entries(self.places.archives):
            digest = archive.name.removesuffix(".tar")
            if archive.name.endswith(".tar") and digest not in owners and self._old(archive):
                removals.append(self._whole(archive, "bundle", "unreferenced"))
        self._done(removals, FREED)
        if not self.dry_run:
            self.forget_inputs()

    def forget_inputs(self) -> None:
        """The held inputs (orbit.server.input_sets) whose bundle is gone, and their entries'
        scratch a crash left: the next submit of them uploads them again. Entries are the
        server's bookkeeping, not removals."""
        for entry in self.places.inputs_index.glob("*/*.json"):
            try:
                with entry.open("rb") as f:  # '{"bundle": "DIGEST", "files": ...}'
                    found = HELD_BUNDLE.match(f.read(128))
            except OSError:
                continue
            if found is None or not (self.places.bundles / found[1].decode()).is_dir():
                entry.unlink(missing_ok=True)
        for tmp in self.places.inputs_index.glob("*/.*.tmp"):
            if self._old(tmp):
                tmp.unlink(missing_ok=True)

    def drop_orphans(self) -> None:
        removals = []
        if self.places.old_cache.exists():
            removals.append(self._whole(self.places.old_cache, "orphan", "unreferenced"))
        for parent in (self.places.artifacts, self.places.work):
            folders = [f for f in _entries(parent) if f.is_dir()]
            known = self.store.storage.known_attempts([f.name for f in folders])
            removals += [
                self._whole(f, "orphan", "unreferenced")
                for f in folders
                if f.name not in known and self._old(f)
            ]
            if not self.dry_run:
                disk.sweep_trash(parent)
        scratch = [f for f in self.places.home.glob(".collect-*") if self._old(f)]
        scratch += [f for f in self.places.bundles.glob(".inputs-*") if self._old(f)]
        removals += [self._whole(f, "orphan", "unreferenced") for f in scratch]
        self._done(removals, FREED)

    # --- helpers ---------------------------------------------------------------------------

    def _whole(
        self,
        path: Path,
        kind: str,
        why: Why,
        run_id: str | None = None,
        attempt_id: str | None = None,
    ) -> Removal:
        size, files = disk.measure(path)
        return Removal.model_validate(
            {
                "kind": kind,
                "why": why,
                "where": "server",
                "path": self._shown(path),
                "bytes": size,
                "files": files,
                "run_id": run_id,
                "attempt_id": attempt_id,
            }
        )

    def _shown(self, path: Path) -> str:
        try:
            return path.relative_to(self.places.home).as_posix()
        except ValueError:
            return str(path)

    def _old(self, path: Path) -> bool:
        try:
            return time.time() - path.lstat().st_mtime >= ORPHAN_GRACE_S
        except OSError:
            return False

    def _done(self, removals: Sequence[Removal], action: str) -> None:
        self.removals += removals
        if removals and not self.dry_run:
            self.store.storage.record_removals(removals, self.actor, action)
            remove_here(self.store, removals, self.places.home)


def _entries(folder: Path) -> list[Path]:
    try:
        return [e for e in folder.iterdir() if not e.name.startswith(".")]
    except OSError:
        return []


def run_removals(store: Store, places: Places, run_ids: Sequence[str], why: Why) -> list[Removal]:
    """Every copy of these runs' attempts: on the server (measured), on their nodes."""
    removals = []
    for a in store.storage.attempts_of(run_ids):
        folder = places.attempt_copy(a["id"], a["backend_key"])
        if folder.exists():
            size, files = disk.measure(folder)
            shown = folder.relative_to(places.home).as_posix()
            removals.append(
                Removal(
                    kind="attempt",
                    why=why,
                    where="server",
                    path=shown,
                    bytes=size,
                    files=files,
                    run_id=a["run_id"],
                    attempt_id=a["id"],
                )
            )
        if a["node"] is not None:
            removals.append(
                Removal(
                    kind="attempt",
                    why=why,
                    where=f"node {a['node']}",
                    path=a["id"],
                    run_id=a["run_id"],
                    attempt_id=a["id"],
                )
            )
    return removals


def remove_here(store: Store, removals: Sequence[Removal], home: Path) -> None:
    """Remove what `removals` name on the server (paths under `home`; the nodes' are queued
    to their agents), and forget the sizes measured of what changed."""
    changed = set()
    for r in removals:
        if r.where != "server":
            continue
        disk.remove(home / r.path)
        if r.attempt_id is not None:
            changed.add(f"attempt:{r.attempt_id}")
        if r.kind == "bundle":
            changed.add(f"bundle:{Path(r.path).name.removesuffix('.tar')}")
    store.storage.forget_sizes(sorted(changed))
