"""Submitting, in DESIGN's order: validate and shape with the task plugin, resolve the template
and apply the overrides, freeze the bundle, route it to its backend, record the handle, audit.
Everything that can be refused is refused before the store is written.

Through `orbit server` the first steps happen where the files are: the client shapes the task
and gathers its inputs (`gather_inputs`); the server shapes the submitted task_request again
over those inputs, refuses a client whose shaping differs from its own (orbit.core.control
.reshape) and freezes the rest as sent (`submit_staged`), so that the bundle is the same either
way. A submit through a server may carry an idempotency key (orbit.core.control.idempotency):
sent again, it is answered with the run it made."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from orbit.core.control.base import ServicePart
from orbit.core.control.idempotency import Idempotency, made_by, made_meanwhile
from orbit.core.control.reshape import ShapedWire as ShapedWire
from orbit.core.control.views import SecretUse, SubmitPlan
from orbit.model import failpoints
from orbit.model.dependencies import After
from orbit.model.env_check import check_env
from orbit.model.errors import InvalidInput
from orbit.model.models import (
    ExecutionRequest,
    ExecutionTemplate,
    JobSpec,
    PrecheckSpec,
    TaskSubmission,
)
from orbit.model.policies import PolicyStamp
from orbit.model.records import RunRecord
from orbit.model.sweeps import sweep_env
from orbit.model.task import CommonTaskFields, ShapedTask
from orbit.store.submit_keys import KeyTaken

if TYPE_CHECKING:
    from orbit.core.execution.bundle import FrozenBundle, Memo
    from orbit.core.tasks import TaskRegistry
    from orbit.store.submit_keys import SubmitKey


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
        SourceSpec,
        parse_sources,
        place_sources,
        snapshot_workdir,
        stage_source,
        write_provenance,
    )

    reserved = [
        shaped.workdir,
        *(s.dest for s in shaped.staged),
        *(u.path for u in shaped.upstreams),
    ]
    specs = parse_sources(common.sources, reserved=reserved)
    workdirs = [s.source for s in shaped.staged if s.dest == shaped.workdir]
    workdir = snapshot_workdir(workdirs[0]) if workdirs else None
    sources = [
        stage_source(spec, index, base_dir, scratch, allow_dirty)
        for index, spec in enumerate(specs)
    ]
    for up in shaped.upstreams:  # exactly as committed, whatever --allow-dirty says
        spec = SourceSpec(repo=up.repo, ref=up.commit, path=up.path)
        index = len(sources)
        sources.append(stage_source(spec, index, base_dir, scratch, False, upstream=up.field))
    place_sources(inputs, sources)
    write_provenance(inputs, sources, workdir)
    if shaped.check_inputs is not None:
        shaped.check_inputs(inputs)


def gather_inputs(
    tasks: TaskRegistry, submission: TaskSubmission, base_dir: Path, source: str, dest: Path
) -> ShapedWire:
    """What a client does before sending a submission to `orbit server`: shape the task with
    its plugin and put everything the bundle's inputs/ will hold into `dest` (the staged files,
    the pinned sources, their provenance), exactly as a local submit would freeze them. The
    wire says where each staged part came from, for the server to shape the task again."""
    from orbit.core.execution.bundle import stage_inputs
    from orbit.core.tasks.client_files import request_links

    base_dir = Path(os.path.abspath(base_dir))
    shaped = tasks.shape(submission.task_type, submission.task_request, base_dir, source)
    check_env(shaped.env)  # here too: the server would refuse it, and ShapedWire cannot hold it
    common = tasks.common_fields(submission.task_request, source)
    dest.mkdir(parents=True, exist_ok=True)
    stage_inputs(dest, shaped.staged)
    (dest / shaped.workdir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".orbit-src-") as scratch:
        add_sources(dest, shaped, common, base_dir, submission.allow_dirty, Path(scratch))
    return ShapedWire.of(shaped, base_dir, request_links(submission.task_request, base_dir))


@dataclass(frozen=True)
class _Shaped:
    """A submission validated, shaped and resolved: everything but the frozen bundle."""

    shaped: ShapedTask
    common: CommonTaskFields
    template: ExecutionTemplate
    request: ExecutionRequest
    job: JobSpec
    after: After | None = None  # the runs it waits for, by full id
    secrets: tuple[SecretUse, ...] = ()  # which of the submitter's secrets it would use
    policy: PolicyStamp = field(default_factory=PolicyStamp)  # what the policy said of it


class Submitting(ServicePart):
    def submit_task(
        self, submission: TaskSubmission, *, base_dir: Path, source: str = "submission"
    ) -> RunRecord:
        """Freeze and launch a run. `experiment_id` may be a name: an unknown one is created."""
        prepared = self._prepare(submission, base_dir, source)
        bundle = self._freeze(prepared, base_dir, submission.allow_dirty, self.bundles_dir)
        return self._create(submission, prepared, bundle)

    def submit_staged(
        self,
        submission: TaskSubmission,
        shaped: ShapedWire,
        inputs: Path,
        source: str,
        idempotency: Idempotency | None = None,
        memo: Memo | None = None,
    ) -> RunRecord:
        """submit_task for a client of `orbit server`: the task was shaped and its inputs
        gathered where its files are (see gather_inputs); `inputs` holds them here. With
        `idempotency`, a key this user sent before with the same request gets its run;
        `memo`: the hashes of the inputs' files, where the caller knows them already."""
        key = idempotency.of(self.actor) if idempotency else None
        earlier = made_by(self.store, key)
        if earlier is not None:
            return earlier
        mine = self._shape_sent(submission, shaped, inputs, source, memo)
        prepared = self._prepare(submission, inputs, source, mine)
        bundle = self._freeze_gathered(prepared, inputs, self.bundles_dir, memo)
        return self._create(submission, prepared, bundle, key)

    def plan_staged(
        self,
        submission: TaskSubmission,
        shaped: ShapedWire,
        inputs: Path,
        source: str,
        memo: Memo | None = None,
    ) -> SubmitPlan:
        """plan_submission for what a client gathered (see submit_staged)."""
        mine = self._shape_sent(submission, shaped, inputs, source, memo)
        prepared = self._prepare(submission, inputs, source, mine)
        return self._plan(
            submission, prepared, lambda cache: self._freeze_gathered(prepared, inputs, cache, memo)
        )

    def _shape_sent(
        self,
        submission: TaskSubmission,
        shaped: ShapedWire,
        inputs: Path,
        source: str,
        memo: Memo | None,
    ) -> ShapedTask:
        from orbit.core.control.reshape import shape_sent

        return shape_sent(self.tasks, submission, shaped, inputs, source, memo)

    def _create(
        self,
        submission: TaskSubmission,
        prepared: _Shaped,
        bundle: FrozenBundle,
        key: SubmitKey | None = None,
    ) -> RunRecord:
        experiment = self._experiment(submission.experiment_id)
        frozen = submission.model_copy(
            update={"experiment_id": experiment.id, "after": prepared.after}
        )
        try:
            run = self.store.runs.create_run(
                experiment_id=experiment.id,
                task_type=submission.task_type,
                template_id=prepared.template.id,
                bundle_digest=bundle.digest,
                submission=frozen,
                request=prepared.request,
                actor=self.actor,
                launcher=self.parts.lifecycle.claim(),
                key=key,
                policy=prepared.policy,
            )
        except KeyTaken:  # the same request, sent again while this one was at work
            assert key is not None
            return made_meanwhile(self.store, key)
        self.parts.launching.launch(run, run.current, prepared.request, actor=self.actor)
        failpoints.hit("after-submit")
        return self.store.runs.get_run(run.id)

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
            request=prepared.request,
            job=prepared.job.model_dump(mode="json"),
            bundle_digest=bundle.digest,
            bundle_files=len(files),
            bundle_bytes=size,
            secrets=list(prepared.secrets),
            policy=prepared.policy,
        )

    def _prepare(
        self,
        submission: TaskSubmission,
        base_dir: Path,
        source: str,
        shaped: ShapedTask | None = None,
    ) -> _Shaped:
        from orbit.core.execution.exec_limits import check_exec_limits
        from orbit.model.launch_modes import task_entrypoint
        from orbit.model.overrides import resolve
        from orbit.store.experiments import check_experiment_name

        experiment = self.store.experiments.find_experiment(submission.experiment_id)
        if experiment is None:
            check_experiment_name(submission.experiment_id)  # before a bundle is frozen for it
        if shaped is None:  # else shaped here over what a client sent (see _shape_sent)
            shaped = self.tasks.shape(
                submission.task_type, submission.task_request, base_dir, source
            )
        common = self.tasks.common_fields(submission.task_request, source)
        template = self.templates.get(submission.template_id)
        request = resolve(template, submission.overrides)
        needs = self.tasks.selector(submission.task_type, submission.task_request, source)
        service_field = self.tasks.service_field(submission.task_type)
        sweep = sweep_env(submission.point)
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
        request, policy = self.parts.policy.admit(
            request,
            submission,
            template,
            experiment.name if experiment is not None else submission.experiment_id,
        )
        self.tasks.check_resources(submission.task_type, submission.task_request, source, request)
        self.execution.backend(request.backend_key).validate(request)
        self.parts.scheduling.check_schedulable(request, submission.queue_anyway, service_field)
        job = JobSpec(
            task_type=submission.task_type,
            template_id=template.id,
            launch_mode=request.launch_mode,
            entrypoint=task_entrypoint(request.launch_mode, shaped),
            workdir=shaped.workdir,
            env={**request.runtime_env, **shaped.env, **sweep},
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
            secrets=request.secrets,
        )
        check_exec_limits(job, request)
        check_env(job.env)  # a sweep's values too: a secret has no place in one
        secrets = self._secrets(job, submission.experiment_id)
        after = self.parts.gate.resolve_after(submission.after, source)
        return _Shaped(shaped, common, template, request, job, after, secrets, policy)

    def _secrets(self, job: JobSpec, experiment: str) -> tuple[SecretUse, ...]:
        """Each of the run's secret references, resolved for the submitter: one that does not
        resolve (no such secret of theirs, the experiment's or everyone's) is refused now, in
        one line naming the field and the secret. A variable the run's env already sets, or
        one of ORBIT's own, cannot be a secret's."""
        for env in sorted(job.secrets):
            if env in job.env:
                raise InvalidInput(
                    f"secrets.{env}: the run's env sets {env} too; a variable is either a "
                    "secret or plain env, not both"
                )
            if env.startswith("ORBIT_"):
                raise InvalidInput(f"secrets.{env}: ORBIT_* variables are ORBIT's own")
        if not job.secrets:
            return ()
        found = self.store.experiments.find_experiment(experiment)
        experiment_id = found.id if found is not None else ""  # a new one has none of its own
        return tuple(self.parts.secrets.uses(job.secrets, self.actor, experiment_id))

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
    def _freeze_gathered(
        prepared: _Shaped, gathered: Path, cache: Path, memo: Memo | None = None
    ) -> FrozenBundle:
        """Freeze inputs a client gathered (gather_inputs) as they are, linked where the
        filesystem allows; `memo`: the hashes of their files, known already."""
        from orbit.core.execution.bundle_link import freeze_linked

        return freeze_linked(prepared.job, gathered, cache, dict(memo or {}))
