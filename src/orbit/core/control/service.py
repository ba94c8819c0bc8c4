"""CoreControlService: the one API the CLI, the HTTP server and the web page all call."""

from __future__ import annotations

import contextlib
import getpass
import os
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orbit.core.audit_chain import ChainCheck
from orbit.core.config import Settings
from orbit.core.control.host_registry import HostRegistry
from orbit.core.errors import InvalidInput, NoBackend, NotFound, OrbitError, Refused, Unreachable
from orbit.core.execution.artifacts import CollectResult
from orbit.core.execution.backends.base import (
    AttemptContext,
    LaunchError,
    LogLayer,
    LogSink,
    ProcessSweep,
    stream_log,
)
from orbit.core.execution.backends.ssh_host_process import SshDockerBackend, SshHostProcessBackend
from orbit.core.execution.bundle import FrozenBundle, freeze_bundle
from orbit.core.execution.docker.host import SweepResult
from orbit.core.execution.exec_limits import check_exec_limits
from orbit.core.execution.launch_modes import task_entrypoint
from orbit.core.execution.leftovers import stop_leftovers, sweep_after_contact
from orbit.core.execution.service import ExecutionService
from orbit.core.execution.sources import (
    parse_sources,
    place_sources,
    read_provenance,
    snapshot_workdir,
    stage_source,
    write_provenance,
)
from orbit.core.execution.ssh.hosts import HostRecord
from orbit.core.execution.ssh.transport import SshOptions, options_for
from orbit.core.models import (
    ATTEMPT_FIELDS,
    ExecutionOverrides,
    ExecutionRequest,
    FailureReason,
    JobSpec,
    PrecheckSpec,
    RetryPolicy,
    RunState,
    RunStatus,
    TaskSubmission,
)
from orbit.core.overrides import check_whitelist, resolve, set_paths
from orbit.core.records import AttemptRecord, AuditEvent, ExperimentRecord, RunRecord
from orbit.core.retry import should_retry
from orbit.core.secret_names import looks_secret
from orbit.core.states import ALLOWED
from orbit.core.tasks import TaskRegistry
from orbit.core.tasks.base import CommonTaskFields, ShapedTask
from orbit.core.templates import TemplateRegistry, default_search_path
from orbit.forensics.evidence import TAILS, WHOLE_FILES, Evidence
from orbit.forensics.progress import PROGRESS_GLOB, TAIL_BYTES, Progress, latest_progress
from orbit.store import Store


def current_actor() -> str:
    try:
        return os.environ.get("ORBIT_ACTOR") or getpass.getuser()
    except Exception:  # no passwd entry for this uid (containers)
        return f"uid:{os.getuid()}"


def _contact_is_old(attempt: AttemptRecord, every_s: float = 1.0) -> bool:
    """Whether the last recorded contact is old enough to be worth a write."""
    last = attempt.last_contact_at
    return last is None or (datetime.now(UTC) - last).total_seconds() >= every_s


@dataclass(frozen=True)
class LogChunk:
    data: bytes
    offset: int
    attempt: AttemptRecord


class CoreControlService:
    def __init__(
        self,
        store: Store,
        execution: ExecutionService,
        templates: TemplateRegistry,
        tasks: TaskRegistry,
        bundles_dir: Path,
        actor: str | None = None,
        ssh_options: SshOptions | None = None,
    ) -> None:
        self.store = store
        self.execution = execution
        self.templates = templates
        self.tasks = tasks
        self.bundles_dir = bundles_dir
        self.actor = actor or current_actor()
        self.hosts = HostRegistry(
            store,
            ssh_options or SshOptions(),
            self.actor,
            sweep=self._sweep_host,
            sweep_processes=self._sweep_host_processes,
        )

    @classmethod
    def from_settings(cls, settings: Settings, cwd: Path | None = None) -> CoreControlService:
        store = Store(settings.database_url)
        return cls(
            store=store,
            execution=ExecutionService.default(settings, store.hosts),
            templates=TemplateRegistry(
                default_search_path(settings.templates_dir, cwd or Path.cwd())
            ),
            tasks=TaskRegistry(),
            bundles_dir=settings.bundles_dir,
            ssh_options=options_for(settings),
        )

    def _sweep_host(self, host: HostRecord, known: set[str]) -> SweepResult:
        backend = self.execution.backend("ssh_docker")
        assert isinstance(backend, SshDockerBackend)
        return backend.sweep(host, known)

    def _sweep_host_processes(self, host: HostRecord, known: set[str]) -> ProcessSweep:
        backend = self.execution.backend("ssh_host_process")
        assert isinstance(backend, SshHostProcessBackend)
        return backend.sweep_processes(host, known)

    # --- submit ---------------------------------------------------------------------------

    def submit_task(
        self, submission: TaskSubmission, *, base_dir: Path, source: str = "submission"
    ) -> RunRecord:
        """Validate and shape, resolve the template, freeze the bundle, route it to its
        backend, record the handle, audit. Everything that can be refused is refused before
        the store is written. `experiment_id` may be a name: an unknown one is created."""
        shaped = self.tasks.shape(submission.task_type, submission.task_request, base_dir, source)
        common = self.tasks.common_fields(submission.task_request, source)
        template = self.templates.get(submission.template_id)
        request = resolve(template, submission.overrides)
        backend = self.execution.backend(request.backend_key)
        backend.validate(request)
        job = JobSpec(
            task_type=submission.task_type,
            template_id=template.id,
            launch_mode=request.launch_mode,
            entrypoint=task_entrypoint(request.launch_mode, shaped),
            workdir=shaped.workdir,
            env={**request.runtime_env, **shaped.env},
            resources=request.resources,
            stop_grace_s=request.stop_grace_s,
            precheck=PrecheckSpec(
                interpreter=shaped.interpreter, critical_imports=tuple(common.critical_imports)
            ),
            task_request={**shaped.request, **common.model_dump(exclude_defaults=True)},
        )
        check_exec_limits(job, request)
        for key in job.env:
            if looks_secret(key):
                raise Refused(
                    f"env {key}: looks like a secret, and ORBIT never freezes secret values into "
                    "a bundle or the store; set it in the environment where the run executes "
                    "(a local run inherits the shell's environment)"
                )
        bundle, _provenance = self._freeze(job, shaped, common, base_dir, submission.allow_dirty)
        experiment = self._experiment(submission.experiment_id)
        frozen = submission.model_copy(update={"experiment_id": experiment.id})
        run = self.store.create_run(
            experiment_id=experiment.id,
            task_type=submission.task_type,
            template_id=template.id,
            bundle_digest=bundle.digest,
            submission=frozen.model_dump(mode="json", exclude_unset=False),
            request=request.model_dump(mode="json"),
            target=request.target,
            backend_key=request.backend_key,
            actor=self.actor,
        )
        self._launch(run, run.current, request)
        return self.store.get_run(run.id)

    def _experiment(self, name_or_id: str) -> ExperimentRecord:
        """Find or create; two submits racing to create the same one both get it."""
        found = self.store.find_experiment(name_or_id)
        if found is not None:
            return found
        try:
            return self.store.create_experiment(name_or_id, self.actor)
        except InvalidInput:
            found = self.store.find_experiment(name_or_id)
            if found is None:
                raise
            return found

    def _freeze(
        self,
        job: JobSpec,
        shaped: ShapedTask,
        common: CommonTaskFields,
        base_dir: Path,
        allow_dirty: bool,
    ) -> tuple[FrozenBundle, dict[str, Any] | None]:
        """Stage pinned git sources (refusing dirty checkouts unless allowed), snapshot the
        workdir's git state, and freeze it all with its provenance into one bundle."""
        specs = parse_sources(
            common.sources, reserved=[shaped.workdir, *(s.dest for s in shaped.staged)]
        )
        workdirs = [s.source for s in shaped.staged if s.dest == shaped.workdir]
        workdir = snapshot_workdir(workdirs[0]) if workdirs else None
        self.bundles_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.bundles_dir, prefix=".tmp-src-") as scratch:
            sources = [
                stage_source(spec, index, base_dir, Path(scratch), allow_dirty)
                for index, spec in enumerate(specs)
            ]

            def add_inputs(inputs: Path) -> None:
                place_sources(inputs, sources)
                write_provenance(inputs, sources, workdir)

            bundle = freeze_bundle(job, shaped.staged, self.bundles_dir, add_inputs)
        return bundle, read_provenance(bundle.path)

    def _bundle(self, digest: str) -> FrozenBundle:
        path = self.bundles_dir / digest
        if not (path / "job.json").is_file():
            raise NotFound(f"bundle {digest[:12]} is no longer in the cache at {path}")
        return FrozenBundle(digest=digest, path=path)

    def _launch(self, run: RunRecord, attempt: AttemptRecord, request: ExecutionRequest) -> None:
        backend = self.execution.backend(request.backend_key)
        context = AttemptContext(run_id=run.id, attempt_id=attempt.id)
        try:
            try:
                bundle = self._bundle(run.bundle_digest)
            except NotFound as exc:
                raise LaunchError(FailureReason.STAGING_FAILED, str(exc)) from None
            try:
                handle = backend.launch(bundle, request, context)
            except (OrbitError, OSError) as exc:  # a backend's refusal or missing tool
                raise LaunchError(FailureReason.LAUNCH_FAILED, str(exc)) from exc
        except LaunchError as exc:
            self.store.move_attempt(
                attempt.id, RunState.FAILED, actor=self.actor, reason=exc.reason, message=str(exc)
            )
            failed = RunStatus(state=RunState.FAILED, reason=exc.reason, message=str(exc))
            self._after_end(self.store.get_run(run.id), failed)
            return
        self.store.set_handle(attempt.id, handle)
        self.store.move_attempt(attempt.id, RunState.SUBMITTED, actor=self.actor)
        self.store.record_event(
            self.actor,
            "run.submitted",
            run_id=run.id,
            attempt_id=attempt.id,
            backend=handle.backend_key,
            target=handle.target,
            location=handle.location,
            **{k: handle.data[k] for k in ("staged_bytes", "bundle_cached") if k in handle.data},
        )

    # --- status ---------------------------------------------------------------------------

    def get_run(self, ref: str) -> RunRecord:
        return self.store.get_run(ref)

    def refresh_run_status(self, ref: str) -> RunRecord:
        """Ask the execution plane where the current attempt stands, move its state, and apply
        the retry policy if it ended."""
        run = self.store.get_run(ref)
        attempt = run.current
        if attempt.state.terminal or attempt.handle is None:
            return run
        try:
            status = self.execution.backend(attempt.backend_key).status(attempt.handle)
        except Unreachable as exc:
            self._unreachable(run, attempt, exc)
            return self.store.get_run(run.id)
        if attempt.unreachable_since is not None or _contact_is_old(attempt):
            self.store.record_contact(attempt.id, reachable=True, actor="orbit")
        if attempt.unreachable_since is not None:  # back: stop what was given up on meanwhile
            live = self.store.hosts.active_attempts()
            swept = sweep_after_contact(self.execution, attempt, live)
            if swept is not None:
                self.hosts.record_stopped(attempt.target or "", swept, actor="orbit")
        if attempt.cancel_requested and attempt.unreachable_since and not status.state.terminal:
            # a cancel asked for while the host did not answer is delivered now (a repeat is
            # harmless: the wrapper is already stopping)
            with contextlib.suppress(Unreachable):
                self.execution.backend(attempt.backend_key).cancel(
                    attempt.handle, FailureReason.CANCELLED
                )
        if status.state in ALLOWED[attempt.state]:
            moved = self.store.move_attempt(
                attempt.id,
                status.state,
                actor="orbit",
                reason=status.reason,
                expect=attempt.state,
                exit_code=status.exit_code,
                message=status.message,
                started_at=status.started_at,
                finished_at=status.finished_at,
            )
            if moved and status.state.terminal:
                self._after_end(self.store.get_run(run.id), status)
        return self.store.get_run(run.id)

    def _unreachable(self, run: RunRecord, attempt: AttemptRecord, exc: Unreachable) -> None:
        """The host did not answer: the attempt keeps its state, marked host_unreachable with
        the time of the last contact. Once every look for the host's unreachable_timeout_s has
        failed (counted from the first failed look, so that a laptop that slept through the
        night does not end a run on its first look back), it ends as terminated
        (host_unreachable), and the retry policy applies."""
        self.store.record_contact(attempt.id, reachable=False, actor="orbit", message=str(exc))
        assert attempt.handle is not None
        timeout = float(attempt.handle.data.get("host", {}).get("unreachable_timeout_s", 600.0))
        since = attempt.unreachable_since
        if since is None:
            return  # the first failed look: only now does the clock start
        silent = (datetime.now(UTC) - since).total_seconds()
        if silent < timeout:
            return
        last = attempt.last_contact_at or attempt.created_at
        message = (
            f"host '{attempt.target}' unreachable for {silent:.0f}s (timeout {timeout:.0f}s; "
            f"last contact {last:%Y-%m-%d %H:%M:%S} UTC): {exc}"
        )
        ended = RunStatus(
            state=RunState.TERMINATED, reason=FailureReason.HOST_UNREACHABLE, message=message
        )
        if self.store.move_attempt(
            attempt.id,
            RunState.TERMINATED,
            actor="orbit",
            reason=FailureReason.HOST_UNREACHABLE,
            expect=attempt.state,
            message=message,
        ):
            self._after_end(self.store.get_run(run.id), ended)

    def _after_end(self, run: RunRecord, status: RunStatus) -> None:
        attempt = run.current
        policy = RetryPolicy.model_validate(run.submission.get("retry", {}))
        retries = 0
        for earlier in reversed(run.attempts):
            if earlier.trigger != "auto_retry":
                break
            retries += 1
        if not should_retry(policy, status, retries, attempt.cancel_requested):
            return
        self.store.record_event(
            "orbit",
            "run.auto_retry",
            run_id=run.id,
            attempt_id=attempt.id,
            reason=status.reason.value if status.reason else None,
            retry=retries + 1,
            max_retries=policy.max_retries,
        )
        request = ExecutionRequest.model_validate(run.request)
        if attempt.target is not None:
            request = request.model_copy(update={"target": attempt.target})
        new = self.store.add_attempt(
            run.id,
            target=attempt.target,
            backend_key=attempt.backend_key,
            trigger="auto_retry",
            actor="orbit",
        )
        self._launch(self.store.get_run(run.id), new, request)

    def refresh_active(self, runs: list[RunRecord]) -> None:
        """Refresh every active run; one whose backend is not available here stays as stored."""
        for run in runs:
            if run.state.terminal:
                continue
            try:
                self.refresh_run_status(run.id)
            except NoBackend:
                continue

    def wait_for(self, ref: str, timeout_s: float | None = None, poll_s: float = 0.5) -> RunRecord:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            run = self.refresh_run_status(ref)
            if run.state.terminal or (deadline is not None and time.monotonic() >= deadline):
                return run
            time.sleep(poll_s)

    def list_runs(
        self,
        *,
        experiment: str | None = None,
        states: set[RunState] | None = None,
        limit: int | None = None,
        refresh: bool = True,
    ) -> list[RunRecord]:
        experiment_id = self.store.get_experiment(experiment).id if experiment else None
        if refresh:
            active = self.store.list_runs(
                experiment_id=experiment_id,
                states={s for s in RunState if not s.terminal},
            )
            self.refresh_active(active)
        return self.store.list_runs(experiment_id=experiment_id, states=states, limit=limit)

    # --- act on runs ----------------------------------------------------------------------

    def cancel_run(self, ref: str, wait_s: float | None = None) -> RunRecord:
        """Ask for a graceful stop; wait up to the grace period (plus a little) for it."""
        run = self.refresh_run_status(ref)
        attempt = run.current
        if attempt.state.terminal:
            with contextlib.suppress(Unreachable):
                self.stop_leftovers(run.id)
            return run
        self.store.request_cancel(attempt.id, self.actor)
        if attempt.handle is None:
            self.store.move_attempt(
                attempt.id, RunState.TERMINATED, actor=self.actor, reason=FailureReason.CANCELLED
            )
            return self.store.get_run(run.id)
        try:
            self.execution.backend(attempt.backend_key).cancel(
                attempt.handle, FailureReason.CANCELLED
            )
        except Unreachable as exc:
            # kept as asked: delivered at the next contact, or the attempt ends when the host's
            # unreachable timeout does (and, cancelled, is not retried)
            self.store.record_contact(
                attempt.id,
                reachable=False,
                actor="orbit",
                message=f"cancel requested; it reaches the host when the host answers: {exc}",
            )
            return self.store.get_run(run.id)
        grace = float(run.request.get("stop_grace_s", 10.0))
        return self.wait_for(run.id, timeout_s=grace + 5 if wait_s is None else wait_s, poll_s=0.2)

    def stop_leftovers(self, ref: str) -> int:
        """Stop the processes still running of a run's ended attempts (on a host that was given
        up on and came back, say); how many were stopped."""
        run = self.store.get_run(ref)
        stopped = stop_leftovers(self.execution, run.attempts)
        for attempt_id, count in stopped.items():
            self.store.record_event(
                self.actor,
                "run.leftovers_stopped",
                run_id=run.id,
                attempt_id=attempt_id,
                processes=count,
            )
        return sum(stopped.values())

    def _same_bundle_request(
        self, run: RunRecord, overrides: ExecutionOverrides, verb: str
    ) -> tuple[ExecutionRequest, dict[str, Any]]:
        """The run's request with attempt-level overrides (target, detach) laid over it, for a
        push of the same bundle. Anything else would change the bundle and is refused."""
        for path in set_paths(overrides):
            if path.split(".")[0] not in ATTEMPT_FIELDS:
                raise Refused(
                    f"override '{path}' would change the bundle; {verb} pushes the same bundle "
                    f"(it may change: {', '.join(sorted(ATTEMPT_FIELDS))}). "
                    "Submit a new run to change it"
                )
        changed = overrides.model_dump(exclude_unset=True)
        if changed:  # only then is the template needed: a retry works from any folder
            check_whitelist(self.templates.get(run.template_id), overrides)
        request = ExecutionRequest.model_validate(run.request).model_copy(update=changed)
        self.execution.backend(request.backend_key).validate(request)
        self._bundle(run.bundle_digest)
        return request, changed

    def retry_run(self, ref: str, overrides: ExecutionOverrides | None = None) -> RunRecord:
        """A new attempt of the same bundle, of the same run."""
        run = self.refresh_run_status(ref)
        if not run.state.terminal:
            raise Refused(f"run {run.id} is {run.state}: cancel it before retrying")
        request, changed = self._same_bundle_request(
            run, overrides or ExecutionOverrides(), "a retry"
        )
        attempt = self.store.add_attempt(
            run.id,
            target=request.target,
            backend_key=request.backend_key,
            trigger="retry",
            actor=self.actor,
        )
        self.store.record_event(
            self.actor, "run.retry", run_id=run.id, attempt_id=attempt.id, overrides=changed
        )
        self._launch(self.store.get_run(run.id), attempt, request)
        return self.store.get_run(run.id)

    def replay_run(self, ref: str, overrides: ExecutionOverrides | None = None) -> RunRecord:
        """A new run of the same bundle, recording which run it replays. Unlike a retry it
        leaves the original run as it is, and works on runs in any state."""
        original = self.store.get_run(ref)
        request, changed = self._same_bundle_request(
            original, overrides or ExecutionOverrides(), "a replay"
        )
        run = self.store.create_run(
            experiment_id=original.experiment_id,
            task_type=original.task_type,
            template_id=original.template_id,
            bundle_digest=original.bundle_digest,
            submission=original.submission,
            request=request.model_dump(mode="json"),
            target=request.target,
            backend_key=request.backend_key,
            actor=self.actor,
            replay_of=original.id,
        )
        self.store.record_event(
            self.actor, "run.replayed", run_id=run.id, replay_of=original.id, overrides=changed
        )
        self._launch(run, run.current, request)
        return self.store.get_run(run.id)

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

    def _attempt(self, run: RunRecord, number: int | None) -> AttemptRecord:
        if number is None:
            return run.current
        for attempt in run.attempts:
            if attempt.number == number:
                return attempt
        raise NotFound(f"run {run.id} has no attempt {number} (it has {len(run.attempts)})")

    def read_log(
        self, ref: str, layer: LogLayer, offset: int = 0, attempt: int | None = None
    ) -> LogChunk:
        found = self._attempt(self.store.get_run(ref), attempt)
        if found.handle is None:
            return LogChunk(b"", offset, found)
        data, new_offset = self.execution.backend(found.backend_key).read_log(
            found.handle, layer, offset
        )
        return LogChunk(data, new_offset, found)

    def stream_log(
        self,
        ref: str,
        layer: LogLayer,
        offset: int,
        sink: LogSink,
        attempt: int | None = None,
        only_attempt: str | None = None,
    ) -> LogChunk:
        """read_log to the log's current end: its bytes go to `sink` as they arrive, in one
        transfer where the backend can (see StreamsLogs); the chunk's data is empty, its offset
        where to go on from. With `only_attempt`, nothing is read unless that is the attempt
        found (a retry began: the caller starts its log from 0)."""
        found = self._attempt(self.store.get_run(ref), attempt)
        if found.handle is None or only_attempt not in (None, found.id):
            return LogChunk(b"", offset, found)
        backend = self.execution.backend(found.backend_key)
        return LogChunk(b"", stream_log(backend, found.handle, layer, offset, sink), found)

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

    # --- experiments and audit ------------------------------------------------------------

    def create_experiment(self, name: str) -> ExperimentRecord:
        return self.store.create_experiment(name, self.actor)

    def list_experiments(self) -> list[ExperimentRecord]:
        return self.store.list_experiments()

    def audit(self, run: str | None = None, limit: int | None = None) -> list[AuditEvent]:
        run_id = self.store.resolve_run_id(run) if run else None
        return self.store.list_events(run_id=run_id, limit=limit)

    def verify_audit(self) -> ChainCheck:
        """Walk the audit trail's hash chain: how many events, the head digest, every problem."""
        return self.store.check_audit()

    def close(self) -> None:
        self.store.close()
