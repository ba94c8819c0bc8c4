"""Submitting, in DESIGN's order: validate and shape with the task plugin, resolve the template
and apply the overrides, freeze the bundle, route it to its backend, record the handle, audit.
Everything that can be refused is refused before the store is written.

Through `orbit server` the first steps happen where the files are: the client shapes the task
and gathers its inputs (`gather_inputs`), and the server freezes what it was sent
(`submit_staged`), so that the bundle is the same either way."""

from __future__ import annotations

import posixpath
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, field_validator, model_validator

from orbit.core.control.scheduling import Scheduling
from orbit.core.control.views import SubmitPlan
from orbit.core.errors import InvalidInput, Refused
from orbit.core.models import (
    ExecutionRequest,
    ExecutionTemplate,
    JobSpec,
    PrecheckSpec,
    Strict,
    TaskSubmission,
    Text,
)
from orbit.core.records import RunRecord
from orbit.core.tasks.base import IMPORT_NAME, CommonTaskFields, ShapedTask

if TYPE_CHECKING:
    from orbit.core.execution.bundle import FrozenBundle
    from orbit.core.tasks import TaskRegistry


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ImportName = Annotated[str, Field(pattern=IMPORT_NAME, max_length=256)]


class ShapedWire(Strict):
    """A shaped task as a client sends it to `orbit server`, beside its gathered inputs."""

    entrypoint: tuple[Text, ...] = Field(min_length=1)
    request: dict[str, Any]
    env: dict[str, Text] = {}
    workdir: str = Field(default="workdir", min_length=1, max_length=256)
    interpreter: str = Field(default="python3", min_length=1, max_length=4096)
    shell_command: str | None = None
    critical_imports: tuple[ImportName, ...] = ()
    optional_imports: tuple[ImportName, ...] = ()

    @field_validator("workdir")
    @classmethod
    def _inside_inputs(cls, value: str) -> str:
        clean = posixpath.normpath(value)
        if value.startswith("/") or clean != value or clean == ".." or clean.startswith("../"):
            raise ValueError("must be a plain relative path inside inputs/ (no '..', no '/')")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not an environment variable name")
        return value

    @model_validator(mode="after")
    def _no_nul(self) -> ShapedWire:
        texts = [*self.entrypoint, *self.env.values(), self.interpreter, self.shell_command or ""]
        if any("\x00" in text for text in texts):
            raise ValueError("a NUL byte cannot be passed to a process")
        return self

    @classmethod
    def of(cls, shaped: ShapedTask) -> ShapedWire:
        """Everything of a shaped task but what it stages (the inputs travel beside it)."""
        return cls(**{name: getattr(shaped, name) for name in cls.model_fields})

    def shaped(self) -> ShapedTask:
        return ShapedTask(**self.model_dump())


def add_sources(
    inputs: Path,
    shaped: ShapedTask,
    common: CommonTaskFields,
    base_dir: Path,
    allow_dirty: bool,
    scratch: Path,
) -> None:
    """Stage the pinned git sources into `inputs` (refusing dirty checkouts unless allowed) and
    record where the code came from: the sources' and the workdir's git state."""
    from orbit.core.execution.sources import (
        parse_sources,
        place_sources,
        snapshot_workdir,
        stage_source,
        write_provenance,
    )

    specs = parse_sources(
        common.sources, reserved=[shaped.workdir, *(s.dest for s in shaped.staged)]
    )
    workdirs = [s.source for s in shaped.staged if s.dest == shaped.workdir]
    workdir = snapshot_workdir(workdirs[0]) if workdirs else None
    sources = [
        stage_source(spec, index, base_dir, scratch, allow_dirty)
        for index, spec in enumerate(specs)
    ]
    place_sources(inputs, sources)
    write_provenance(inputs, sources, workdir)


def gather_inputs(
    tasks: TaskRegistry, submission: TaskSubmission, base_dir: Path, source: str, dest: Path
) -> ShapedWire:
    """What a client does before sending a submission to `orbit server`: shape the task with
    its plugin and put everything the bundle's inputs/ will hold into `dest` (the staged files,
    the pinned sources, their provenance), exactly as a local submit would freeze them."""
    from orbit.core.execution.bundle import stage_inputs

    shaped = tasks.shape(submission.task_type, submission.task_request, base_dir, source)
    common = tasks.common_fields(submission.task_request, source)
    dest.mkdir(parents=True, exist_ok=True)
    stage_inputs(dest, shaped.staged)
    (dest / shaped.workdir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".orbit-src-") as scratch:
        add_sources(dest, shaped, common, base_dir, submission.allow_dirty, Path(scratch))
    return ShapedWire.of(shaped)


@dataclass(frozen=True)
class _Shaped:
    """A submission validated, shaped and resolved: everything but the frozen bundle."""

    shaped: ShapedTask
    common: CommonTaskFields
    template: ExecutionTemplate
    request: ExecutionRequest
    job: JobSpec


class Submitting(Scheduling):
    def submit_task(
        self, submission: TaskSubmission, *, base_dir: Path, source: str = "submission"
    ) -> RunRecord:
        """Freeze and launch a run. `experiment_id` may be a name: an unknown one is created."""
        prepared = self._prepare(submission, base_dir, source)
        bundle = self._freeze(prepared, base_dir, submission.allow_dirty, self.bundles_dir)
        return self._create(submission, prepared, bundle)

    def submit_staged(
        self, submission: TaskSubmission, shaped: ShapedWire, inputs: Path, source: str
    ) -> RunRecord:
        """submit_task for a client of `orbit server`: the task was shaped and its inputs
        gathered where its files are (see gather_inputs); `inputs` holds them here."""
        prepared = self._prepare(submission, inputs, source, shaped.shaped())
        bundle = self._freeze_gathered(prepared, inputs, self.bundles_dir)
        return self._create(submission, prepared, bundle)

    def plan_staged(
        self, submission: TaskSubmission, shaped: ShapedWire, inputs: Path, source: str
    ) -> SubmitPlan:
        """plan_submission for what a client gathered (see submit_staged)."""
        prepared = self._prepare(submission, inputs, source, shaped.shaped())
        return self._plan(
            submission, prepared, lambda cache: self._freeze_gathered(prepared, inputs, cache)
        )

    def _create(
        self, submission: TaskSubmission, prepared: _Shaped, bundle: FrozenBundle
    ) -> RunRecord:
        experiment = self._experiment(submission.experiment_id)
        frozen = submission.model_copy(update={"experiment_id": experiment.id})
        run = self.store.create_run(
            experiment_id=experiment.id,
            task_type=submission.task_type,
            template_id=prepared.template.id,
            bundle_digest=bundle.digest,
            submission=frozen.model_dump(mode="json", exclude_unset=False),
            request=prepared.request.model_dump(mode="json"),
            target=prepared.request.target,
            backend_key=prepared.request.backend_key,
            actor=self.actor,
            launcher=self._claim(),
        )
        self._launch(run, run.current, prepared.request, actor=self.actor)
        return self.store.get_run(run.id)

    def plan_submission(
        self, submission: TaskSubmission, *, base_dir: Path, source: str = "submission"
    ) -> SubmitPlan:
        """What `submit` would run and where, without writing anything: the bundle is frozen
        in a scratch cache (for its digest) and removed again; the store is not touched."""
        prepared = self._prepare(submission, base_dir, source)
        return self._plan(
            submission,
            prepared,
            lambda cache: self._freeze(prepared, base_dir, submission.allow_dirty, cache),
        )

    def _plan(
        self,
        submission: TaskSubmission,
        prepared: _Shaped,
        freeze: Callable[[Path], FrozenBundle],
    ) -> SubmitPlan:
        self.bundles_dir.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".dry-run-", dir=self.bundles_dir.parent))
        try:
            bundle = freeze(scratch)
            files = [p for p in bundle.path.rglob("*") if p.is_file()]
            size = sum(p.stat().st_size for p in files)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return SubmitPlan(
            experiment=submission.experiment_id,
            task_type=submission.task_type,
            template_id=prepared.template.id,
            backend_key=prepared.request.backend_key,
            target=prepared.request.target,
            request=prepared.request.model_dump(mode="json"),
            job=prepared.job.model_dump(mode="json"),
            bundle_digest=bundle.digest,
            bundle_files=len(files),
            bundle_bytes=size,
        )

    def _prepare(
        self,
        submission: TaskSubmission,
        base_dir: Path,
        source: str,
        shaped: ShapedTask | None = None,
    ) -> _Shaped:
        from orbit.core.execution.exec_limits import check_exec_limits
        from orbit.core.execution.launch_modes import task_entrypoint
        from orbit.core.overrides import resolve
        from orbit.core.secret_names import looks_secret
        from orbit.store.experiments import check_experiment_name

        if self.store.find_experiment(submission.experiment_id) is None:
            check_experiment_name(submission.experiment_id)  # before a bundle is frozen for it
        if shaped is None:
            shaped = self.tasks.shape(
                submission.task_type, submission.task_request, base_dir, source
            )
        else:  # shaped by the client: its request must still be one the plugin accepts
            self.tasks.validate(submission.task_type, submission.task_request, source)
        common = self.tasks.common_fields(submission.task_request, source)
        template = self.templates.get(submission.template_id)
        request = resolve(template, submission.overrides)
        needs = self.tasks.selector(submission.task_type, submission.task_request, source)
        service_field = self.tasks.service_field(submission.task_type)
        if needs:
            if request.placement.kind != "agent_pool":
                instead = (
                    "give task.url instead"
                    if service_field == "task.service"
                    else ("use a pool template")
                )
                raise InvalidInput(
                    f"{source}: {service_field}: only agent-pool nodes advertise model servers "
                    f"(orbit agent --service NAME=URL), and template '{template.id}' places on "
                    f"{request.placement.kind}: {instead}"
                )
            request = request.model_copy(update={"selector": {**request.selector, **needs}})
        self.tasks.check_resources(submission.task_type, submission.task_request, source, request)
        self.execution.backend(request.backend_key).validate(request)
        self.check_schedulable(request, submission.queue_anyway, service_field)
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
                interpreter=shaped.interpreter,
                critical_imports=tuple(
                    dict.fromkeys([*shaped.critical_imports, *common.critical_imports])
                ),
                optional_imports=shaped.optional_imports,
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
        return _Shaped(shaped, common, template, request, job)

    def _freeze(
        self, prepared: _Shaped, base_dir: Path, allow_dirty: bool, cache: Path
    ) -> FrozenBundle:
        """Stage pinned git sources (refusing dirty checkouts unless allowed), snapshot the
        workdir's git state, and freeze it all with its provenance into one bundle."""
        from orbit.core.execution.bundle import freeze_bundle

        shaped, common = prepared.shaped, prepared.common
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache, prefix=".tmp-src-") as scratch:

            def add_inputs(inputs: Path) -> None:
                add_sources(inputs, shaped, common, base_dir, allow_dirty, Path(scratch))

            return freeze_bundle(prepared.job, shaped.staged, cache, add_inputs)

    @staticmethod
    def _freeze_gathered(prepared: _Shaped, gathered: Path, cache: Path) -> FrozenBundle:
        """Freeze inputs a client gathered (gather_inputs) as they are."""
        from orbit.core.execution.bundle import freeze_bundle

        def add_inputs(inputs: Path) -> None:
            shutil.copytree(gathered, inputs, symlinks=True, dirs_exist_ok=True)

        return freeze_bundle(prepared.job, (), cache, add_inputs)
