"""Storage as people manage it: pin a run (retention keeps it), delete runs, run gc, see usage,
and serve a collect from the control plane's one copy. Who may do it is the server's to check
(owners and admins delete and pin; admins run gc); these only do it, audited. The work is in
copies.py (where each attempt's copy is), gc.py and usage.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from orbit.core.control.base import ServicePart, attempt_of
from orbit.model.errors import InvalidInput, Refused
from orbit.model.records import AttemptRecord, CollectResult, RunRecord
from orbit.model.storage import GcReport, Removal, RunStorage, Usage

if TYPE_CHECKING:
    from orbit.core.control.copies import Places
    from orbit.core.storage.wire import Have, Item, Partial
    from orbit.model.retention import Retention
    from orbit.store import Store

WHY_WORDS = {
    "checkpoints": "retention (keep_checkpoints)",
    "expired": "retention (artifacts_days)",
    "deleted": "orbit runs delete",
    "unreferenced": "gc",
}


@dataclass
class CollectPlan:
    """A collect served over HTTP: what the client is told first, and the files to send."""

    summary: dict[str, Any]
    items: list[Item] = field(default_factory=list)


class Storage(ServicePart):
    @property
    def places(self) -> Places:
        from orbit.core.control.copies import Places

        return Places(self.bundles_dir.parent)

    def retention_rules(self) -> Retention:
        from orbit.model.retention import load_storage_config

        if self.config.retention is not None:
            return self.config.retention
        return load_storage_config(self.config.storage_config_file).retention

    # --- marks ---------------------------------------------------------------------------

    def run_storage(self, ref: str) -> RunStorage:
        return self.store.storage.marks(self.store.runs.resolve_run_id(ref))

    def pin_run(self, ref: str, pinned: bool = True) -> RunStorage:
        """Pinned, a run is never touched by retention or gc, nor deleted until unpinned."""
        run_id = self.store.runs.resolve_run_id(ref)
        marks = self.store.storage.marks(run_id)
        if marks.deleted_at is not None:
            raise Refused(f"run {run_id} was deleted {_when(marks.deleted_at)}: nothing to pin")
        return self.store.storage.pin(run_id, pinned, self.actor)

    # --- deleting ------------------------------------------------------------------------

    def delete_runs(self, refs: Sequence[str], dry_run: bool = False) -> GcReport:
        """Remove the runs' artifacts on the server and their nodes, and each bundle no other
        run refers to; the runs' records and audit trails stay, marked deleted. Refused whole
        (nothing removed) if any of them is pinned or still running."""
        from orbit.core.control import gc

        runs = [self.parts.lifecycle.refresh_run_status(ref) for ref in dict.fromkeys(refs)]
        runs = list({r.id: r for r in runs}.values())
        for run in runs:
            self._deletable(run)
        removals = []
        kept = []
        for run in runs:
            if self.store.storage.marks(run.id).deleted_at is not None:
                kept.append(f"run {run.id}: already deleted")
                continue
            mine = gc.run_removals(self.store, self.places, [run.id], "deleted")
            removals += mine
            if not dry_run:
                self.store.storage.mark_gone(run.id, "deleted", self.actor, mine)
                gc.remove_here(self.store, mine, self.places.home)
        going = {r.id for r in runs}
        for digest in sorted({r.bundle_digest for r in runs}):
            users = [u["id"] for u in self.store.storage.bundle_users(digest)]
            others = [u for u in users if u not in going] if dry_run else users
            if others:
                kept.append(f"bundle {digest[:12]}: still used by run {others[0]}")
                continue
            removals += self._drop_bundle(digest, dry_run)
        return GcReport.of(removals, kept, dry_run=dry_run)

    def _deletable(self, run: RunRecord) -> None:
        marks = self.store.storage.marks(run.id)
        if marks.pinned:
            raise Refused(
                f"run {run.id} is pinned (by {marks.pinned_by}): `orbit runs unpin {run.id}` "
                "first; nothing was deleted"
            )
        active = [a for a in run.attempts if not a.state.terminal]
        if active:
            raise Refused(
                f"run {run.id} is {active[-1].state} (attempt {active[-1].number}): its "
                f"attempt needs its files; cancel it first (orbit cancel {run.id}); nothing "
                "was deleted"
            )

    def _drop_bundle(self, digest: str, dry_run: bool) -> list[Removal]:
        """A bundle no run that is not deleted uses: its folder and its archive."""
        from orbit.core.control import gc
        from orbit.core.storage import disk

        removals = []
        for path in (self.places.bundles / digest, self.places.archives / f"{digest}.tar"):
            if path.exists():
                size, files = disk.measure(path)
                shown = path.relative_to(self.places.home).as_posix()
                removals.append(
                    Removal(
                        kind="bundle",
                        why="unreferenced",
                        where="server",
                        path=shown,
                        bytes=size,
                        files=files,
                    )
                )
        if removals and not dry_run:
            self.store.storage.record_removals(removals, self.actor, gc.FREED)
            gc.remove_here(self.store, removals, self.places.home)
        return removals

    # --- gc and usage ----------------------------------------------------------------------

    def collect_garbage(self, dry_run: bool = False, since: datetime | None = None) -> GcReport:
        """Apply the retention rules and remove what nothing refers to (orbit.core.control.gc)."""
        from orbit.core.control.gc import GcPass

        rules = self.retention_rules()
        now = datetime.now(UTC)
        return GcPass(
            self.store, self.places, self.actor, rules, dry_run=dry_run, since=since, now=now
        ).run()

    def gc_if_due(self, holder: str, every_s: float, full: bool = False) -> GcReport | None:
        """The server loop's pass, if it is due and no other replica took it. Checkpoints
        are looked for in runs that changed since the last pass (an hour's margin), or in
        every run when `full` (a server's first pass: its rules may be new)."""
        now = datetime.now(UTC)
        last = self.store.storage.last_gc()
        if not self.store.storage.claim_gc(holder, now, now + timedelta(seconds=every_s)):
            return None
        since = None if full or last is None else last - timedelta(hours=1)
        return self.collect_garbage(since=since)

    def usage(self) -> Usage:
        from orbit.core.control.usage import UsageCount

        return UsageCount(self.store, self.places).count()

    # --- collect served from the one copy ----------------------------------------------------

    def plan_collect(
        self,
        ref: str,
        attempt: int | None,
        have: Sequence[Have] = (),
        partial: Sequence[Partial] = (),
    ) -> CollectPlan:
        """What a client lacks of an attempt's artifacts (see orbit.core.storage.wire)."""
        from orbit.core.control.copies import gather
        from orbit.core.storage import wire

        run = self.parts.lifecycle.refresh_run_status(ref)
        found = attempt_of(run, attempt)
        refuse_gone(self.store, run)
        if found.handle is None:
            raise InvalidInput(f"run {run.id} attempt {found.number} never started: no artifacts")
        backend = self.execution.backend(found.backend_key)
        held, changed = gather(backend, found.handle, self.places, found.id)
        if changed:
            self.store.storage.forget_sizes([f"attempt:{found.id}"])
        held.removed = removed_notes(self.store, found)
        files = wire.listing(held)
        items = wire.to_send(files, have, partial)
        moved = sum(i.size - i.offset for i in items)
        self.store.audit.record_event(
            self.actor,
            "run.collected",
            run_id=run.id,
            attempt_id=found.id,
            files=len(files.files),
            bytes=files.bytes,
            moved=moved,
        )
        summary = {
            "attempt": found.number,
            "files": len(files.files),
            "bytes": files.bytes,
            "moved": moved,
            "problems": held.problems,
            "removed": held.removed,
            "roots": [prefix for prefix, _ in held.roots],
        }
        return CollectPlan(summary, items)


def refuse_gone(store: Store, run: RunRecord) -> None:
    """A run deleted, or whose artifacts retention removed, has none to collect: one line."""
    marks = store.storage.marks(run.id)
    if marks.deleted_at is not None:
        raise Refused(
            f"run {run.id} was deleted {_when(marks.deleted_at)} by {marks.deleted_by}: its "
            "artifacts are gone (its record and audit trail stay)"
        )
    if marks.expired_at is not None:
        raise Refused(
            f"run {run.id}'s artifacts were removed by retention {_when(marks.expired_at)} "
            "(artifacts_days; `orbit runs pin RUN` keeps a run's artifacts)"
        )


def removed_notes(store: Store, attempt: AttemptRecord) -> dict[str, str]:
    """What retention removed of the attempt's (and its gang's) artifacts, by the path it
    had under the collect's destination: the reason, for collect to say."""
    prefixes = {attempt.id: ""}
    for member in (attempt.handle.data.get("gang") or ()) if attempt.handle else ():
        if member.get("rank"):
            prefixes[str(member["attempt"])] = f"nodes/{member['rank']}/"
    notes = {}
    for attempt_id, prefix in prefixes.items():
        for path, why, at in store.storage.removed_paths(attempt_id):
            if path:
                notes[prefix + path] = f"removed by {WHY_WORDS.get(why, why)} {_when(at)}"
    return notes


def note_removed(store: Store, attempt: AttemptRecord, result: CollectResult) -> CollectResult:
    """An embedded collect's result with what retention removed said, not called missing."""
    notes = removed_notes(store, attempt)
    if not notes:
        return result
    from orbit.core.execution.artifacts import verify_manifest

    found, problems = verify_manifest(result.dest, removed=list(notes))
    return result.model_copy(
        update={
            "verified": found and not problems,
            "problems": tuple(problems),
            "removed": tuple(f"{path}: {why}" for path, why in sorted(notes.items())),
        }
    )


def _when(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
