"""Looking at runs: one or a page of them with what is known about them, their logs, their
progress, the evidence a post-mortem reads, inspect and diff, and collecting artifacts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from orbit.core.control.actions import RunActions
from orbit.core.control.views import LogChunk, RunDiff, RunPage, RunView
from orbit.core.errors import InvalidInput, OrbitError, Unreachable
from orbit.core.execution.backends.base import LogSink, stream_log
from orbit.core.execution.runtime_state import parse_json
from orbit.core.layers import LogLayer
from orbit.core.models import RunState
from orbit.core.records import CollectResult, RunRecord
from orbit.forensics.evidence import IMAGE_FILE, TAILS, WHOLE_FILES, Evidence
from orbit.forensics.progress import PROGRESS_GLOB, TAIL_BYTES, Progress, latest_progress

if TYPE_CHECKING:
    from orbit.forensics.diagnose import Inspection


class Reading(RunActions):
    def get_run(self, ref: str) -> RunRecord:
        return self.store.get_run(ref)

    def list_runs(
        self,
        *,
        experiment: str | None = None,
        states: set[RunState] | None = None,
        limit: int | None = None,
        refresh: bool = True,
    ) -> list[RunRecord]:
        """Newest first; active runs are refreshed from where they run first."""
        experiment_id = self.store.get_experiment(experiment).id if experiment else None
        return self._list_runs(experiment_id, states, limit, refresh)

    def _list_runs(
        self,
        experiment_id: str | None,
        states: set[RunState] | None,
        limit: int | None,
        refresh: bool = True,
    ) -> list[RunRecord]:
        if refresh and self.looks_on_read:
            active = self.store.list_runs(
                experiment_id=experiment_id,
                states={s for s in RunState if not s.terminal},
            )
            self.refresh_active(active)
        return self.store.list_runs(experiment_id=experiment_id, states=states, limit=limit)

    def run_page(
        self,
        *,
        experiment: str | None = None,
        states: set[RunState] | None = None,
        limit: int | None = None,
    ) -> RunPage:
        """`list_runs` as views, with how many runs match in all."""
        experiment_id = self.store.get_experiment(experiment).id if experiment else None
        runs = self._list_runs(experiment_id, states, limit)
        total = self.store.count_runs(experiment_id=experiment_id, states=states)
        return RunPage.model_construct(runs=tuple(self._view(r) for r in runs), total=total)

    def run_view(self, ref: str, *, refresh: bool = True, images: bool = False) -> RunView:
        """A run refreshed from where it runs, with its progress (and, if asked, the image
        each attempt ran). Without `refresh`, only what the store and the bundle cache know:
        nothing reaches the execution plane (right after a launch, say)."""
        if not refresh:
            return self._view(self.store.get_run(ref))
        run = self.refresh_run_status(ref) if self.looks_on_read else self.store.get_run(ref)
        return self._view(run, self.progress(run), self._attempt_images(run) if images else {})

    def _view(
        self,
        run: RunRecord,
        progress: Progress | None = None,
        images: dict[str, dict[str, Any]] | None = None,
    ) -> RunView:
        from orbit.core.execution.provenance import read_provenance

        return RunView.model_construct(  # of records already made: nothing to validate
            run=run,
            bundle_path=str(self.bundles_dir / run.bundle_digest),
            progress=progress,
            provenance=read_provenance(self.bundles_dir / run.bundle_digest),
            images=images or {},
        )

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
        found = self._attempt(run, attempt)
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
        run = self.refresh_run_status(ref)
        found = self._attempt(run, attempt)
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
        found = self._attempt(self.store.get_run(ref), attempt)
        ended = found.state.terminal
        data, new_offset = b"", offset
        if found.handle is not None:
            data, new_offset = self.execution.backend(found.backend_key).read_log(
                found.handle, layer, offset
            )
        return LogChunk(
            data=data, offset=new_offset, attempt=found.number, attempt_id=found.id, ended=ended
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
        found = self._attempt(self.store.get_run(ref), attempt)
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
        run = self.refresh_run_status(ref)
        found = self._attempt(run, attempt)
        if found.handle is None:
            raise InvalidInput(f"run {run.id} attempt {found.number} never started: no artifacts")
        result = self.execution.backend(found.backend_key).collect(found.handle, dest)
        self.store.record_event(
            self.actor,
            "run.collected",
            run_id=run.id,
            attempt_id=found.id,
            dest=str(dest),
            files=result.files,
            bytes=result.bytes,
            verified=result.verified,
        )
        return result
