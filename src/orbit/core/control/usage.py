"""Bytes on the control plane by user and experiment (`orbit usage`, /api/v1/usage, /metrics).

Each attempt's copy counts for its run's user and experiment; each bundle (its folder and the
archive agents fetch) for the run that first froze it, so that shared bundles count once. A
copy that can no longer change (its attempt ended and, on an agent pool, all its files
arrived) is measured once and its size kept in the store; the rest are measured each time."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from orbit.core.control.copies import Places
from orbit.core.execution.mirror import read_agent_state
from orbit.core.storage import disk
from orbit.model.models import RunState
from orbit.model.storage import Usage, UsageRow
from orbit.store import Store
from orbit.store.sql import Row


@dataclass
class _Tally:
    runs: set[str] = field(default_factory=set)
    artifacts: int = 0
    bundles: int = 0

    def row(self, name: str) -> UsageRow:
        return UsageRow(
            name=name,
            runs=len(self.runs),
            artifacts_bytes=self.artifacts,
            bundles_bytes=self.bundles,
            total_bytes=self.artifacts + self.bundles,
        )


class UsageCount:
    def __init__(self, store: Store, places: Places) -> None:
        self.store, self.places = store, places
        self.cached = store.storage.sizes()
        self.fresh: dict[str, tuple[int, int]] = {}
        self.users: dict[str, _Tally] = defaultdict(_Tally)
        self.experiments: dict[str, _Tally] = defaultdict(_Tally)
        self.other = 0

    def count(self) -> Usage:
        seen = self._attempts()
        self._bundles()
        self._strays(seen)
        self.store.storage.save_sizes(self.fresh)
        return Usage(
            users=tuple(t.row(n) for n, t in sorted(self.users.items())),
            experiments=tuple(t.row(n) for n, t in sorted(self.experiments.items())),
            artifacts_bytes=sum(t.artifacts for t in self.users.values()),
            bundles_bytes=sum(t.bundles for t in self.users.values()),
            other_bytes=self.other,
        )

    def _attempts(self) -> set[str]:
        seen = set()
        for row in self.store.storage.attempts_for_usage():
            seen.add(row["id"])
            size = self._attempt_size(row)
            for tally in (self.users[row["user_name"]], self.experiments[row["experiment"]]):
                if row["deleted_at"] is None:  # a deleted run's leftovers count, not the run
                    tally.runs.add(row["run_id"])
                tally.artifacts += size
        return seen

    def _attempt_size(self, row: Row) -> int:
        key = f"attempt:{row['id']}"
        if key in self.cached:
            return self.cached[key][0]
        folder = self.places.attempt_copy(row["id"], row["backend_key"])
        measured = disk.measure(folder)
        if self._settled(row, folder.name):
            self.fresh[key] = measured
        return measured[0]

    def _settled(self, row: Row, attempt_id: str) -> bool:
        """Whether the copy can no longer change by itself (gc forgets what it changes)."""
        if row["deleted_at"] is not None or row["expired_at"] is not None:
            return False  # gone: measured each time (nothing, once its removal is done)
        if not RunState(row["state"]).terminal:
            return False
        if row["backend_key"].startswith("agent_pool"):
            return bool(read_agent_state(self.places.artifacts / attempt_id).get("complete"))
        # an SSH host's copy changes only when a collect brings files (which forgets it)
        return True

    def _bundles(self) -> None:
        owners = self.store.storage.bundle_owners()
        for folder in _folders(self.places.bundles):
            key = f"bundle:{folder.name}"
            if key not in self.cached:  # a frozen bundle never changes
                self.fresh[key] = disk.measure(folder)
            size = (self.cached.get(key) or self.fresh[key])[0]
            size += disk.measure(self.places.archives / f"{folder.name}.tar")[0]
            owner = owners.get(folder.name)
            if owner is None:
                self.other += size
                continue
            self.users[owner[0]].bundles += size
            self.experiments[owner[1]].bundles += size

    def _strays(self, seen: set[str]) -> None:
        """Folders of no attempt, and the old collect cache: gc removes them."""
        for parent in (self.places.artifacts, self.places.work):
            for folder in _folders(parent):
                if folder.name not in seen:
                    self.other += disk.measure(folder)[0]
        self.other += disk.measure(self.places.old_cache)[0]


def _folders(parent: Path) -> list[Path]:
    try:
        return [f for f in parent.iterdir() if f.is_dir() and not f.name.startswith(".")]
    except OSError:
        return []
