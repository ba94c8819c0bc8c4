"""The clusters part of the control service: register Slurm clusters, check what they offer
and which ORBIT jobs in their queues no live attempt owns (cancelled only when asked: a
sweep), forget them. A cluster is checked (sinfo, scontrol) before it is recorded, unless asked
not to."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orbit.core.control.base import ServicePart
from orbit.model.clusters import ClusterCheck, ClusterFacts, ClusterRecord, ClusterSpec, SlurmOrphan
from orbit.model.errors import NotFound, OrbitError
from orbit.model.models import RunState
from orbit.store.cluster_table import ClusterTable, already_exists

if TYPE_CHECKING:
    from orbit.core.execution.backends.slurm_host_process import SlurmHostProcessBackend


class Clusters(ServicePart):
    @property
    def clusters(self) -> ClusterTable:
        return ClusterTable(self.store.db)

    def probe_cluster(self, spec: ClusterSpec) -> ClusterFacts:
        from orbit.core.execution.backends.slurm_host_process import local_work_dir
        from orbit.core.execution.slurm.facts import probe
        from orbit.core.execution.slurm.shell import ClusterShell

        work = spec.work_dir if spec.ssh is not None else local_work_dir(spec)
        return probe(ClusterShell(spec, self.hosts.options), work)

    def add_cluster(self, spec: ClusterSpec, *, check: bool = True) -> ClusterRecord:
        """Record a cluster; with `check` (the default) Slurm is asked first, and a cluster
        whose commands fail or whose login node does not answer is not recorded."""
        if self.clusters.taken(spec.name):  # before a probe that may be slow
            raise already_exists(spec.name)
        facts = self.probe_cluster(spec) if check else None
        return self.clusters.add(spec, facts, self.actor)

    def list_clusters(self) -> list[ClusterRecord]:
        return self.clusters.all()

    def get_cluster(self, name: str) -> ClusterRecord:
        return self.clusters.get(name)

    def check_cluster(self, name: str, *, sweep: bool = False) -> ClusterCheck:
        """Ask Slurm again and record what the cluster offers; list this login's ORBIT jobs
        in its queue that no live attempt owns, and with `sweep` cancel those of this control
        plane (another control plane's are only listed)."""
        cluster = self.clusters.get(name)
        cluster = self.clusters.set_facts(name, self.probe_cluster(cluster.spec), self.actor)
        backend = self._slurm_backend()
        orphans = self._orphans(backend, cluster)
        if not sweep:
            return ClusterCheck(cluster=cluster, orphans=tuple(orphans))
        doomed = [o for o in orphans if o.why != "other_plane"]
        try:
            backend.cancel_jobs(cluster, [o.job_id for o in doomed])
        except OrbitError as exc:
            return ClusterCheck(
                cluster=cluster, orphans=tuple(orphans), swept=True, sweep_error=str(exc)
            )
        if doomed:
            self.store.audit.record_event(
                self.actor,
                "cluster.swept",
                cluster=name,
                jobs=[o.job_id for o in doomed],
                attempts=sorted({o.attempt_id for o in doomed}),
            )
        cancelled = [o.model_copy(update={"cancelled": o in doomed}) for o in orphans]
        return ClusterCheck(cluster=cluster, orphans=tuple(cancelled), swept=True)

    def _slurm_backend(self) -> SlurmHostProcessBackend:
        from orbit.core.execution.backends.slurm_host_process import SlurmHostProcessBackend

        backend = self.execution.backend("slurm_host_process")
        assert isinstance(backend, SlurmHostProcessBackend)
        return backend

    def _orphans(
        self, backend: SlurmHostProcessBackend, cluster: ClusterRecord
    ) -> list[SlurmOrphan]:
        live = self.clusters.active_attempts()  # anywhere: one cluster may have two names
        found = []
        for job in backend.marked_jobs(cluster):
            if job.plane and backend.plane and job.plane != backend.plane:
                why = "other_plane"
            elif job.attempt_id in live:
                continue
            else:
                try:
                    self.store.runs.get_attempt(job.attempt_id)
                    why = "ended"
                except NotFound:
                    why = "unknown"
            found.append(
                SlurmOrphan(
                    job_id=job.job_id,
                    state=job.state,
                    run_id=job.run_id,
                    attempt_id=job.attempt_id,
                    plane=job.plane,
                    why=why,
                )
            )
        return found

    def remove_cluster(self, name: str) -> list[str]:
        """Forget a cluster; returns the runs still active there (their handles keep how to
        reach it, so they can still be followed, cancelled and collected)."""
        self.clusters.get(name)
        active = self.store.runs.list_runs(states={s for s in RunState if not s.terminal})
        runs = [r.id for r in active if r.current.target == name]
        self.clusters.remove(name, self.actor)
        return runs
