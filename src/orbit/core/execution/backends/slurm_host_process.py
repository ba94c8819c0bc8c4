"""`slurm_host_process`: the attempt runs as one Slurm batch job on a registered cluster.

The bundle is staged into the cluster's work dir by digest (a local copy on a submit host, the
SSH transport through a login node: an unchanged bundle moves nothing), copied into
attempts/ATTEMPT_ID/, and scripts/slurm.sbatch written there runs the bundle's own wrapper as
the job. Slurm stays the scheduler of its cluster: status is the wrapper's runtime/ files,
cross-checked with what Slurm says of the job (pending: provisioning, with Slurm's reason; an
end the wrapper could not record: Slurm's reason for it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from orbit.core.execution.backends.base import (
    AttemptContext,
    CopyArtifacts,
    LaunchError,
    LogLayer,
    LogSink,
    attempt_env,
)
from orbit.core.execution.backends.local_host_process import LocalHostProcessBackend
from orbit.core.execution.backends.ssh_host_process import NoHosts, SshHostProcessBackend
from orbit.core.execution.gang import gang_status
from orbit.core.execution.runtime_state import parse_json, status_from_files
from orbit.core.execution.slurm import jobs
from orbit.core.execution.slurm.orphans import SQUEUE, MarkedJob, parse_marked
from orbit.core.execution.slurm.script import SCRIPT, check_request, sbatch_script
from orbit.core.execution.slurm.shell import ClusterShell, login_spec, slurm_message
from orbit.core.execution.ssh.transport import SshOptions
from orbit.model.clusters import ClusterRecord, ClusterSpec
from orbit.model.errors import OrbitError, Refused, Unreachable
from orbit.model.models import ExecutionRequest, FailureReason, RunHandle, RunState, RunStatus

if TYPE_CHECKING:
    from orbit.core.execution.bundle import FrozenBundle
    from orbit.model.records import CollectResult


class ClusterDirectory(Protocol):
    """What the Slurm backend asks the control plane about clusters (the store)."""

    def find(self, name: str) -> ClusterRecord | None: ...


class SlurmHostProcessBackend:
    key = "slurm_host_process"

    def __init__(self, clusters: ClusterDirectory, options: SshOptions, plane: str = "") -> None:
        self.clusters = clusters
        self.options = options
        self.plane = plane
        self._local_files = LocalHostProcessBackend(Path("."))  # reads at handle.location
        self._ssh_files = SshHostProcessBackend(NoHosts(), options)  # at handle.data["host"]

    # --- before the store is written ------------------------------------------------------

    def cluster(self, target: str | None, template_id: str) -> ClusterRecord:
        if not target:
            raise Refused(
                f"template '{template_id}' runs on a registered Slurm cluster: give one with "
                "--set target=NAME (see 'orbit clusters list'; add one with 'orbit clusters add')"
            )
        found = self.clusters.find(target)
        if found is None:
            raise Refused(
                f"target '{target}' is not a registered cluster (see 'orbit clusters list'; "
                f"add it with 'orbit clusters add {target} --local' or --ssh LOGIN_NODE)"
            )
        return found

    def validate(self, request: ExecutionRequest) -> None:
        check_request(self.cluster(request.target, request.template_id), request)

    # --- launch ---------------------------------------------------------------------------

    def launch(
        self, bundle: FrozenBundle, request: ExecutionRequest, attempt: AttemptContext
    ) -> RunHandle:
        cluster = self.cluster(request.target, request.template_id)  # refused: launch_failed
        shell = ClusterShell(cluster.spec, self.options)
        try:
            work, staged = self._stage(shell, bundle)
            prepared = shell.hostside("prepare", work, bundle.digest, attempt.attempt_id)
            if "error" in prepared:
                raise OrbitError(f"{shell.where}: {prepared['error']}")
            location = str(prepared["location"])
            plane = {"ORBIT_PLANE": self.plane} if self.plane else {}
            env = {**attempt_env(bundle, request, attempt), **plane}
            script = sbatch_script(
                cluster,
                request,
                run_id=attempt.run_id,
                attempt_id=attempt.attempt_id,
                location=location,
                env=env,
                frozen=f"{work}/bundles/{bundle.digest}",
                plane=self.plane,
                secrets=bool(attempt.secrets),
            )
            shell.write(f"{location}/{SCRIPT}", script.encode())
            if attempt.secrets:  # a file per rank, 0600, each deleted by its wrapper
                shell.put_secrets(location, attempt.secrets, request.num_nodes)
        except Unreachable as exc:
            raise LaunchError(FailureReason.HOST_UNREACHABLE, str(exc)) from exc
        except OrbitError as exc:
            raise LaunchError(FailureReason.STAGING_FAILED, str(exc)) from exc
        try:
            done = shell.run(["sbatch", "--parsable", f"{location}/{SCRIPT}"])
        except OrbitError as exc:
            if attempt.secrets:
                shell.drop_secrets(location)
            raise LaunchError(FailureReason.LAUNCH_FAILED, str(exc)) from exc
        job_id = done.stdout.strip().split(";")[0]
        if done.returncode != 0 or not job_id.isdigit():
            if attempt.secrets:
                shell.drop_secrets(location)
            raise LaunchError(
                FailureReason.LAUNCH_FAILED,
                f"{shell.where} refused the job: {slurm_message(done.stderr) or 'no message'}",
            )
        handle = self._handle(cluster.spec, attempt.attempt_id, location, work)
        data = {**handle.data, "job_id": job_id, "stop_grace_s": request.stop_grace_s, **staged}
        if request.num_nodes > 1:
            data["num_nodes"] = request.num_nodes
        return handle.model_copy(update={"data": data})

    def _stage(self, shell: ClusterShell, bundle: FrozenBundle) -> tuple[str, dict[str, object]]:
        """The bundle's frozen parts into WORK/bundles/DIGEST/, once per digest."""
        if shell.ssh is not None:
            from orbit.core.execution.ssh.transfer import stage_bundle

            found = stage_bundle(shell.ssh, bundle)
            return str(found["work"]), {
                "staged_bytes": found["sent"],
                "bundle_cached": found["cached"],
            }
        import shutil

        from orbit.core.execution.bundle import FROZEN_PARTS

        found = shell.hostside("stage-check", local_work_dir(shell.spec), bundle.digest)
        work = str(found["work"])
        if not found["cached"]:
            partial = Path(work) / str(found["partial"])
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            for part in FROZEN_PARTS:
                source = bundle.path / part
                if source.is_dir():
                    shutil.copytree(source, partial / part, symlinks=True)
                else:
                    shutil.copy2(source, partial / part)
            done = shell.hostside("stage-commit", work, bundle.digest)
            if "error" in done:
                raise OrbitError(f"{shell.where}: {done['error']}")
        return work, {"bundle_cached": bool(found["cached"])}

    def _data(self, spec: ClusterSpec, work: str) -> dict[str, object]:
        data: dict[str, object] = {"cluster": spec.model_dump(mode="json"), "work_dir": work}
        if spec.ssh is not None:  # what the SSH reads of logs and files go by
            data["host"] = login_spec(spec).model_dump(mode="json")
        return data

    def _handle(self, spec: ClusterSpec, attempt_id: str, location: str, work: str) -> RunHandle:
        return RunHandle(
            backend_key=self.key,
            target=spec.name,
            attempt_id=attempt_id,
            location=location,
            data=self._data(spec, work),
        )

    def locate(self, request: ExecutionRequest, attempt: AttemptContext) -> RunHandle | None:
        """An attempt whose launcher died: found by its job's name in Slurm, else never
        submitted (its folder alone is not a job)."""
        cluster = self.cluster(request.target, request.template_id)
        shell = ClusterShell(cluster.spec, self.options)
        name = f"orbit-{attempt.attempt_id}"
        done = shell.run(["squeue", "-h", "--states=all", "-n", name, "-o", "%i"])
        ids = done.stdout.split()
        if done.returncode != 0 or not ids:
            return None
        work = str(shell.hostside("stage-check", self._work(shell), "-")["work"])
        location = f"{work}/attempts/{attempt.attempt_id}"
        handle = self._handle(cluster.spec, attempt.attempt_id, location, work)
        data = {**handle.data, "job_id": ids[0], "stop_grace_s": request.stop_grace_s}
        if request.num_nodes > 1:
            data["num_nodes"] = request.num_nodes
        return handle.model_copy(update={"data": data})

    # --- the cluster's queue -----------------------------------------------------------------

    def marked_jobs(self, cluster: ClusterRecord) -> list[MarkedJob]:
        """This login's jobs in the cluster's queue that carry ORBIT's marks."""
        return parse_marked(ClusterShell(cluster.spec, self.options).output(SQUEUE))

    def cancel_jobs(self, cluster: ClusterRecord, job_ids: list[str]) -> None:
        if job_ids:
            ClusterShell(cluster.spec, self.options).output(["scancel", *job_ids])

    def _work(self, shell: ClusterShell) -> str:
        return shell.spec.work_dir if shell.ssh is not None else local_work_dir(shell.spec)

    # --- an attempt that was launched ----------------------------------------------------

    def _shell(self, handle: RunHandle) -> ClusterShell:
        """The cluster as registered now, else as it was at the launch."""
        current = self.clusters.find(handle.target)
        spec = (
            current.spec
            if current is not None
            else ClusterSpec.model_validate(handle.data["cluster"])
        )
        return ClusterShell(spec, self.options)

    def _files(self, handle: RunHandle) -> LocalHostProcessBackend | SshHostProcessBackend:
        return self._ssh_files if "host" in handle.data else self._local_files

    def status(self, handle: RunHandle) -> RunStatus:
        shell = self._shell(handle)
        job_id = str(handle.data["job_id"])
        job = jobs.look(shell, job_id)
        nodes = _num_nodes(handle)
        found = self._probe(shell, handle, handle.location, 0)
        if found.get("missing"):
            return RunStatus(
                state=RunState.FAILED,
                reason=FailureReason.RUNTIME_LOST,
                message=f"{handle.location} is gone from {shell.where}",
            )
        status = parse_json(found.get("status"))
        if job is not None and job.pending and status is None:  # never started (a requeued
            # job that did start has its files: it is ended below, not shown pending again)
            if job.reason in ("", "None"):  # not looked at by the scheduler yet
                return RunStatus(state=RunState.SUBMITTED)
            return RunStatus(state=RunState.PROVISIONING, message=job.describe_pending())
        seen = _rank_status(found, job)
        if nodes > 1:
            ranks = [(_where(seen), seen)]
            for rank in range(1, nodes):
                other = self._probe(shell, handle, f"{handle.location}/nodes/{rank}", rank)
                status_of = _rank_status(other, job)
                ranks.append((_where(status_of), status_of))
            seen = gang_status(ranks)
        if not seen.state.terminal:
            return seen
        if (
            job is not None
            and job.active
            and (job.pending or (nodes > 1 and seen.state is not RunState.SUCCEEDED))
        ):
            # ended here, still in Slurm: a requeued job waiting to start again, or a gang's
            # other ranks running on after one failed. A job whose wrappers all ended ends by
            # itself as its batch shell exits: a scancel then raced that exit, and a run that
            # succeeded showed in Slurm as CANCELLED
            shell.run(["scancel", job_id])
        return self._slurm_reason(seen, job)

    @staticmethod
    def _probe(shell: ClusterShell, handle: RunHandle, where: str, rank: int) -> dict[str, Any]:
        """One rank's runtime files (its processes are told apart from the other ranks' on a
        shared host by ORBIT_NODE_RANK)."""
        if _num_nodes(handle) == 1:
            return shell.hostside("probe", where, handle.attempt_id)
        return shell.hostside("probe", where, handle.attempt_id, str(rank))

    @staticmethod
    def _slurm_reason(seen: RunStatus, job: jobs.SlurmJob | None) -> RunStatus:
        """Slurm's word for an end, where it says more than the wrapper could: a job killed
        outright left no result, and a SIGTERM the wrapper saw as a preemption may have been
        the node failing (an end without a result is runtime_lost, as is a wrapper's death its
        job's shell recorded)."""
        if job is None or job.state not in jobs.ENDINGS:
            return seen
        if seen.reason not in (FailureReason.PREEMPTED, FailureReason.RUNTIME_LOST):
            return seen  # the wrapper knew why (a cancel, max_runtime, the task's own exit)
        state, reason = jobs.ENDINGS[job.state]
        why = f"Slurm ended job {job.job_id} as {job.state}"
        return seen.model_copy(
            update={
                "state": state,
                "reason": reason,
                "message": f"{why}; {seen.message}" if seen.message else why,
            }
        )

    def read_log(self, handle: RunHandle, layer: LogLayer, offset: int) -> tuple[bytes, int]:
        return self._files(handle).read_log(handle, layer, offset)

    def read_log_end(self, handle: RunHandle, layer: LogLayer, max_bytes: int) -> tuple[bytes, int]:
        return self._files(handle).read_log_end(handle, layer, max_bytes)

    def stream_log(self, handle: RunHandle, layer: LogLayer, offset: int, sink: LogSink) -> int:
        files = self._files(handle)
        if isinstance(files, SshHostProcessBackend):
            return files.stream_log(handle, layer, offset, sink)
        while True:
            data, offset = files.read_log(handle, layer, offset)
            if not data:
                return offset
            sink(data)

    def read_file(self, handle: RunHandle, relpath: str) -> bytes | None:
        return self._files(handle).read_file(handle, relpath)

    def read_range(
        self, handle: RunHandle, relpath: str, offset: int, limit: int
    ) -> tuple[bytes, int]:
        return self._files(handle).read_range(handle, relpath, offset, limit)

    def tail_files(self, handle: RunHandle, pattern: str, max_bytes: int) -> dict[str, bytes]:
        return self._files(handle).tail_files(handle, pattern, max_bytes)

    def cancel(self, handle: RunHandle, reason: FailureReason) -> None:
        """Say why in runtime/stop_request.json, TERM the batch shell (which hands it to the
        wrapper: a graceful stop), and `scancel` the job once the grace period is over, from a
        process left behind on the cluster, so no cancelled job lingers in the queue."""
        shell = self._shell(handle)
        job_id = str(handle.data["job_id"])
        at = datetime.now(UTC).isoformat()
        request = json.dumps({"reason": reason.value, "at": at}) + "\n"
        shell.write(f"{handle.location}/runtime/stop_request.json", request.encode())
        grace = math.ceil(float(handle.data.get("stop_grace_s", 0)) or 0)
        later = grace + 15  # the wrapper's own kill after the grace, and its manifest
        shell.run(
            [
                "sh",
                "-c",
                'scancel --batch --signal=TERM "$1" 2>/dev/null || scancel "$1"; '
                # a job cancelled before it started leaves no secrets unread (script.py)
                '(sleep "$2"; scancel "$1"; rm -rf "$3/secrets") >/dev/null 2>&1 </dev/null &',
                "-",
                job_id,
                str(later),
                handle.location,
            ]
        )

    def collect(self, handle: RunHandle, dest: Path) -> CollectResult:
        """The attempt's artifacts; a multi-node run's other ranks' under nodes/RANK/."""
        files = self._files(handle)
        return self._each_rank(handle, dest, lambda h, d: files.collect(h, d))

    def collect_in_place(self, handle: RunHandle, copy: CopyArtifacts) -> CollectResult | None:
        """On a cluster whose filesystem is this machine's, its folders as they are."""
        files = self._files(handle)
        if not isinstance(files, LocalHostProcessBackend):
            return None
        return self._each_rank(
            handle, Path("."), lambda h, d: copy(Path(h.location).expanduser() / "artifacts", d)
        )

    def _each_rank(
        self, handle: RunHandle, dest: Path, collect: Callable[[RunHandle, Path], CollectResult]
    ) -> CollectResult:
        files = self._files(handle)
        got = collect(handle, dest)
        for rank in range(1, _num_nodes(handle)):
            where = f"{handle.location}/nodes/{rank}"
            rank_handle = handle.model_copy(update={"location": where})
            if files.read_file(rank_handle, "job.json") is None:  # srun never started it
                got = got.and_problem(f"rank {rank}: never started (no {where})")
                continue
            got = got.and_rank(rank, collect(rank_handle, dest / "nodes" / str(rank)))
        return got


def _num_nodes(handle: RunHandle) -> int:
    return int(handle.data.get("num_nodes") or 1)


def _rank_status(found: dict[str, Any], job: jobs.SlurmJob | None) -> RunStatus:
    """One rank's state from its probe, beside what Slurm says of the job. While Slurm runs
    the job, a wrapper this host does not see alive is taken as Slurm sees it: starting, or
    as its status says (its lock may not show across a cluster's filesystem); a wrapper that
    died is said by its shell's result (scripts/slurm.sbatch). Once Slurm has ended the job,
    a wrapper still seen alive does not keep the run going."""
    status, result = parse_json(found.get("status")), parse_json(found.get("result"))
    alive = bool(found.get("alive"))
    if job is not None and not job.active and job.state:
        # Slurm has ended the job (NODE_FAIL for a node set DOWN, the moment it is set): what
        # still runs of it on the node is Slurm's to kill and holds the run no longer, whose
        # end is Slurm's to say (a node gone down may never answer that kill)
        alive = False
    if result is None and not alive:
        if job is not None and job.active:
            if status is None:
                return RunStatus(state=RunState.STARTING)  # the wrapper is on its way
            return status_from_files(status, None, wrapper_alive=True)
        if found.get("missing"):  # a rank whose folder srun never made
            return RunStatus(
                state=RunState.FAILED,
                reason=FailureReason.RUNTIME_LOST,
                message="its wrapper never started (see runtime/slurm-JOB.out)",
            )
    return status_from_files(status, result, alive)


def _where(status: RunStatus) -> str:
    return f"host '{status.host}'" if status.host else "its node"


def local_work_dir(spec: ClusterSpec) -> str:
    """A relative work dir of a local cluster is under the user's home, as over SSH."""
    return spec.work_dir if spec.work_dir.startswith(("/", "~")) else f"~/{spec.work_dir}"
