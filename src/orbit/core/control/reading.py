"""Looking at runs: one or a page of them with what is known about them, their logs, their
progress, the evidence a post-mortem reads, inspect and diff, and collecting artifacts."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orbit.core.control.base import ServicePart, attempt_of
from orbit.core.control.views import LogChunk, LogPlace, RunDiff, RunPage, RunView, WaitView
from orbit.core.execution.backends.base import LogSink, stream_log
from orbit.core.execution.runtime_state import parse_json
from orbit.forensics.evidence import IMAGE_FILE, TAILS, WHOLE_FILES, Evidence
from orbit.forensics.progress import PROGRESS_GLOB, TAIL_BYTES, Progress, latest_progress
from orbit.model.errors import InvalidInput, OrbitError, Unreachable
from orbit.model.layers import LogLayer
from orbit.model.models import RunState
from orbit.model.records import CollectResult, RunRecord
from orbit.store.run_queries import RunFilter

if TYPE_CHECKING:
    from orbit.forensics.diagnose import Inspection


class Reading(ServicePart):
    def get_run(self, ref: str) -> RunRecord:
        return self.store.runs.get_run(ref)

    def list_runs(
        self,
        *,
        experiment: str | None = None,
        states: set[RunState] | None = None,
        limit: int | None = None,
        refresh: bool = True,
    ) -> list[RunRecord]:
        """Newest first; active runs are refreshed from where they run first."""
        experiment_id = self.store.experiments.get_experiment(experiment).id if experiment else None
        return self._list_runs(RunFilter(experiment_id, states), limit, refresh)

    def _list_runs(
        self, found: RunFilter, limit: int | None, refresh: bool = True
    ) -> list[RunRecord]:
        if refresh and self.config.looks_on_read:
            active = self.store.runs.list_runs(
                **found.but(states={s for s in RunState if not s.terminal}).query()
            )
            self.parts.lifecycle.refresh_active(active)
        return self.store.runs.list_runs(**found.query(), limit=limit)

    def run_page(
        self,
        *,
        experiment: str | None = None,
        states: set[RunState] | None = None,
        limit: int | None = None,
        user: str | None = None,
        node: str | None = None,
        mine: bool = False,
        template: str | None = None,
        text: str | None = None,
        before: tuple[datetime, str] | None = None,
        count_cap: int | None = None,
        viewer: str | None = None,
        group: str | None = None,
    ) -> RunPage:
        """`list_runs` as views, with how many runs match in all. `user`: runs that user
        submitted (`mine`: the caller's own); `node`: runs whose current attempt is on that
        node, host or cluster; `template`, `text` (in a run's id or experiment's name) and
        `before` (the page after that run: its created_at and id) as the console asks;
        `count_cap`: `total` counts no further than that and one more; `viewer`: not the
        runs of the restricted experiments that user is not a member of; `group`: the runs
        of that group (a sweep's), by id or prefix."""
        if mine and user is not None:
            raise InvalidInput("--mine and --user: give one of them")
        experiment_id = self.store.experiments.get_experiment(experiment).id if experiment else None
        found = RunFilter(
            experiment_id, states, self.actor if mine else user, node, template, text
        ).but(
            viewer=viewer,
            group_id=self.store.groups.resolve_group_id(group) if group is not None else None,
        )
        runs = self._list_runs(found.but(before=before), limit)
        total = self.store.runs.count_runs(**found.query(), cap=count_cap)
        waits = self.waits_of(runs)
        views = tuple(self._view(r, wait=waits.get(r.current.id)) for r in runs)
        return RunPage.model_construct(runs=views, total=total)

    def run_view(self, ref: str, *, refresh: bool = True, images: bool = False) -> RunView:
        """A run refreshed from where it runs, with its progress (and, if asked, the image
        each attempt ran). Without `refresh`, only what the store and the bundle cache know:
        nothing reaches the execution plane (right after a launch, say)."""
        if not refresh:
            run = self.store.runs.get_run(ref)
            return self._view(run, wait=self.waits_of([run]).get(run.current.id))
        run = (
            self.parts.lifecycle.refresh_run_status(ref)
            if self.config.looks_on_read
            else self.store.runs.get_run(ref)
        )
        images_of = self._attempt_images(run) if images else {}
        wait = self.waits_of([run]).get(run.current.id)
        view = self._view(run, self.progress(run), images_of, wait)
        return view.model_copy(update={"storage": self.store.storage.marks(run.id)})

    def _view(
        self,
        run: RunRecord,
        progress: Progress | None = None,
        images: dict[str, dict[str, Any]] | None = None,
        wait: WaitView | None = None,
    ) -> RunView:
        from orbit.core.execution.provenance import read_provenance

        return RunView.model_construct(  # of records already made: nothing to validate
            run=run,
            bundle_path=str(self.bundles_dir / run.bundle_digest),
            progress=progress,
            provenance=read_provenance(self.bundles_dir / run.bundle_digest),
            images=images or {},
            wait=wait,
        )

    def waits_of(self, runs: list[RunRecord]) -> dict[str, WaitView]:
        """What each run's current attempt that is not launched yet waits for, as it stands
        now (attempt id -> it): one read of their scheduler decisions."""
        from orbit.core.control.waits import waits_of

        return waits_of(self.store, [r.current for r in runs])

    def _attempt_images(self, run: RunRecord) -> dict[str, dict[str, Any]]:
        """attempt id -> its image record, for the attempts that ran in a container and got as
        far as finding their image. A host that cannot be read now leaves its attempts out."""
        found: dict[str, dict[str, Any]] = {}
        for attempt in run.attempts:
            if attempt.handle is None or not attempt.backend_key.endswith("_docker"):
                continue
            try:
                backend = self.execution.backend(attempt.backend_key)
                record = parse_json(backend.read_file(attempt.handle, IMAGE_FILE))
            except OrbitError:  # no backend here, or its host is unreachable
                continue
            if record is not None:
                found[attempt.id] = record
        return found

    def progress(self, run: RunRecord, attempt: int | None = None) -> Progress | None:
        """The newest step/loss the task logged to artifacts/**/logging.jsonl."""
        found = attempt_of(run, attempt)
        if found.handle is None:
            return None
        backend = self.execution.backend(found.backend_key)
        try:
            return latest_progress(backend.tail_files(found.handle, PROGRESS_GLOB, TAIL_BYTES))
        except Unreachable:  # the run shows as host_unreachable; progress waits for the host
            return None

    def evidence(self, ref: str, attempt: int | None = None) -> Evidence:
        """The files a post-mortem reads, from wherever the attempt ran (job.json from the
        bundle cache when the attempt never started)."""
        run = self.parts.lifecycle.refresh_run_status(ref)
        found = attempt_of(run, attempt)
        files: dict[str, bytes] = {}
        tails: dict[str, bytes] = {}
        if found.handle is not None:
            backend = self.execution.backend(found.backend_key)
            try:
                for relpath in WHOLE_FILES:
                    content = backend.read_file(found.handle, relpath)
                    if content is not None:
                        files[relpath] = content
                for pattern, size in TAILS.items():
                    tails.update(backend.tail_files(found.handle, pattern, size))
            except Unreachable:  # what the bundle cache and the store know still tells a lot
                pass
        cached = self.bundles_dir / run.bundle_digest
        for relpath in ("job.json", "inputs/.orbit/provenance.json"):
            if relpath not in files and (cached / relpath).is_file():
                files[relpath] = (cached / relpath).read_bytes()
        return Evidence(run=run, attempt=found, files=files, tails=tails)

    def inspect_run(self, ref: str, attempt: int | None = None) -> Inspection:
        """Walk the layered logs and say at which layer the run first went wrong."""
        from orbit.forensics.diagnose import inspect_run

        return inspect_run(self.evidence(ref, attempt))

    def diff_runs(self, ref_a: str, ref_b: str) -> RunDiff:
        from orbit.forensics.rundiff import diff_runs

        a, b = self.evidence(ref_a), self.evidence(ref_b)
        return RunDiff(a=a.run.id, b=b.run.id, differences=tuple(diff_runs(a, b)))

    def read_log(
        self, ref: str, layer: LogLayer, offset: int = 0, attempt: int | None = None
    ) -> LogChunk:
        """Bytes of a log from `offset`; `ended` says whether the attempt had ended before
        they were read (so, once a read returns nothing, nothing more will come)."""
        found = attempt_of(self.store.runs.get_run(ref), attempt)
        ended = found.state.terminal
        data, new_offset = b"", offset
        if found.handle is not None:
            data, new_offset = self.execution.backend(found.backend_key).read_log(
                found.handle, layer, offset
            )
        return LogChunk(
            data=data, offset=new_offset, attempt=found.number, attempt_id=found.id, ended=ended
        )

    def find_log_start(
        self,
        ref: str,
        layer: LogLayer,
        *,
        lines: int | None = None,
        since: datetime | None = None,
        attempt: int | None = None,
    ) -> LogPlace:
        """Where a log's last `lines` lines, of those written after `since`, begin (either or
        both): read on from there (stream_log) for `orbit logs --tail N --since WHEN`. Only
        the log's end is read to find it (see orbit.core.execution.log_start)."""
        from orbit.core.execution.log_start import log_start

        if lines is not None and lines < 0:
            raise InvalidInput(f"lines: expected 0 or more, got {lines}")
        if since is not None and since.tzinfo is None:
            raise InvalidInput("since: expected a time with its zone (as 2026-05-01T12:00:00Z)")
        found = attempt_of(self.store.runs.get_run(ref), attempt)
        offset = 0
        if found.handle is not None and (lines is not None or since is not None):
            backend = self.execution.backend(found.backend_key)
            offset = log_start(backend, found.handle, layer, lines, since)
        return LogPlace(
            offset=offset, attempt=found.number, attempt_id=found.id, ended=found.state.terminal
        )

    def stream_log(
        self,
        ref: str,
        layer: LogLayer,
        offset: int,
        sink: LogSink,
        attempt: int | None = None,
        only_attempt: str | None = None,
        follow: bool = False,
    ) -> LogChunk:
        """read_log to the log's current end: its bytes go to `sink` as they arrive, in one
        transfer where the backend can (see StreamsLogs); the chunk's data is empty, its offset
        where to go on from. With `only_attempt`, nothing is read unless that is the attempt
        found (a retry began: the caller starts its log from 0). `follow` allows waiting for
        more while the attempt runs (over HTTP, the server holds the stream); here the call
        returns at the current end either way, and the caller asks again."""
        found = attempt_of(self.store.runs.get_run(ref), attempt)
        ended = found.state.terminal
        new_offset = offset
        if found.handle is not None and only_attempt in (None, found.id):
            backend = self.execution.backend(found.backend_key)
            new_offset = stream_log(backend, found.handle, layer, offset, sink)
        return LogChunk(
            data=b"", offset=new_offset, attempt=found.number, attempt_id=found.id, ended=ended
        )

    def collect_run_artifacts(
        self, ref: str, dest: Path, attempt: int | None = None
    ) -> CollectResult:
        from orbit.core.control.storage import note_removed, refuse_gone

        run = self.parts.lifecycle.refresh_run_status(ref)
        found = attempt_of(run, attempt)
        refuse_gone(self.store, run)
        if found.handle is None:
            raise InvalidInput(f"run {run.id} attempt {found.number} never started: no artifacts")
        result = self.execution.backend(found.backend_key).collect(found.handle, dest)
        result = note_removed(self.store, found, result)
        self.store.audit.record_event(
            self.actor,
            "run.collected",
            run_id=run.id,
            attempt_id=found.id,
            dest=str(dest),
            files=result.files,
            bytes=result.bytes,
            moved=result.moved,
            verified=result.verified,
        )
        return result
