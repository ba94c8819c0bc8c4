"""The clusters part of the control service: register Slurm clusters, check what they offer,
forget them. A cluster is checked (sinfo, scontrol) before it is recorded, unless asked not to."""

from __future__ import annotations

from orbit.core.clusters import ClusterFacts, ClusterRecord, ClusterSpec
from orbit.core.control.base import ServiceBase
from orbit.core.models import RunState
from orbit.store.cluster_table import ClusterTable, already_exists


class Clusters(ServiceBase):
    @property
    def clusters(self) -> ClusterTable:
        return ClusterTable(self.store)

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

    def check_cluster(self, name: str) -> ClusterRecord:
        cluster = self.clusters.get(name)
        return self.clusters.set_facts(name, self.probe_cluster(cluster.spec), self.actor)

    def remove_cluster(self, name: str) -> list[str]:
        """Forget a cluster; returns the runs still active there (their handles keep how to
        reach it, so they can still be followed, cancelled and collected)."""
        self.clusters.get(name)
        active = self.store.list_runs(states={s for s in RunState if not s.terminal})
        runs = [r.id for r in active if r.current.target == name]
        self.clusters.remove(name, self.actor)
        return runs
