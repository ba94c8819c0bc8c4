"""What storage commands hand back: a run's marks (pinned, deleted, expired), a gc pass's
removals, and usage by user and experiment."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from orbit.model.models import Record

# what a removal removed: an attempt's whole copy, one checkpoint of it, a bundle (and its
# archive), or something no record refers to (an old collect cache, a folder of no attempt)
Kind = Literal["attempt", "checkpoint", "bundle", "orphan"]
# why: the run was deleted; retention (artifacts_days, keep_checkpoints); nothing refers to it
Why = Literal["deleted", "expired", "checkpoints", "unreferenced"]


class RunStorage(Record):
    """A run's storage marks. Its record and audit trail stay whatever they say."""

    pinned: bool = False
    pinned_by: str | None = None
    pinned_at: datetime | None = None
    deleted_at: datetime | None = None
    deleted_by: str | None = None
    expired_at: datetime | None = None  # its artifacts removed by retention

    @property
    def gone(self) -> datetime | None:
        """When its artifacts were removed (deleted or expired), if they were."""
        return self.deleted_at or self.expired_at


class Removal(Record):
    """One thing removed (or, in a dry run, that would be)."""

    kind: Kind
    why: Why
    where: str  # `server`, or `node NAME` (queued there: its agent removes it when told)
    path: str  # on the server: relative to $ORBIT_HOME; on a node: the attempt's id
    relpath: str | None = None  # a checkpoint: its path under the attempt's artifacts/
    bytes: int = 0  # on a node: not known here (0)
    files: int = 0
    run_id: str | None = None
    attempt_id: str | None = None


class GcReport(Record):
    """A gc pass, `orbit runs delete` or a dry run of either: what went (or would go), what
    was left because something still needs it, and the bytes freed on the server."""

    dry_run: bool = False
    removals: tuple[Removal, ...] = ()
    kept: tuple[str, ...] = ()  # one line each: what was left, and what needs it
    bytes: int = 0  # freed on the server (or, in a dry run, that would be)

    @classmethod
    def of(
        cls, removals: Sequence[Removal], kept: Sequence[str] = (), dry_run: bool = False
    ) -> GcReport:
        return cls(
            dry_run=dry_run,
            removals=tuple(removals),
            kept=tuple(kept),
            bytes=sum(r.bytes for r in removals),
        )


class UsageRow(Record):
    """Bytes one user or experiment holds on the control plane."""

    name: str
    runs: int = 0
    artifacts_bytes: int = 0
    bundles_bytes: int = 0
    total_bytes: int = 0


class Usage(Record):
    """Bytes on the control plane by user and by experiment, and in all. Artifacts: each
    attempt's copy (a pool or SSH attempt's files in $ORBIT_HOME/artifacts/, a local one's
    folder in $ORBIT_HOME/work/); bundles: each frozen bundle and its archive, counted for
    the run that first froze it (later runs of the same bundle add nothing)."""

    users: tuple[UsageRow, ...] = ()
    experiments: tuple[UsageRow, ...] = ()
    artifacts_bytes: int = 0
    bundles_bytes: int = 0
    other_bytes: int = 0  # what no run claims (left from a crash): gc removes it
