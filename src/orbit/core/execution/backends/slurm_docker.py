"""`slurm_docker`: the attempt runs as one Slurm batch job on a registered cluster, the task in a
container on the Docker where the job runs.

The placement is `slurm_host_process`'s: the same staging, scripts/slurm.sbatch, status, cancel
and collect. The bundle's wrapper, started by the job, runs the docker launch mode's
scripts/docker_run.sh (as on any other placement), and removes the attempt's containers
whatever happens. Here: the refusals, before anything is staged, of what the cluster's last
check says its Docker cannot run.
"""

from __future__ import annotations

from orbit.core.execution.backends.slurm_host_process import SlurmHostProcessBackend
from orbit.model.clusters import ClusterRecord
from orbit.model.errors import Refused
from orbit.model.models import ExecutionRequest


class SlurmDockerBackend(SlurmHostProcessBackend):
    key = "slurm_docker"

    def validate(self, request: ExecutionRequest) -> None:
        cluster = self.cluster(request.target, request.template_id)
        check_docker(cluster, request)
        super().validate(request)


def check_docker(cluster: ClusterRecord, request: ExecutionRequest) -> None:
    """Refuse, in one line naming the cluster and its last check, a container run its Docker
    cannot serve: no docker, a CLI that reached no daemon, or GPUs without NVIDIA's runtime."""
    if request.launch_mode.kind != "docker":
        return
    facts = cluster.facts
    name = cluster.name
    if facts is None:
        return  # never checked: the wrapper's docker will find out, and say so
    when = f"(orbit clusters check {name}, {facts.checked_at:%Y-%m-%d %H:%M} UTC)"
    where = facts.docker_where or "where its jobs are submitted"
    on_nodes = (
        ""
        if cluster.spec.docker_on_nodes
        else " (compute nodes with docker: add it again with --docker-on-nodes)"
    )
    if facts.docker is None:
        raise Refused(
            f"cluster '{name}' has no docker on {where} {when}: use the slurm template "
            f"(slurm_host_process) there, or install docker and check again{on_nodes}"
        )
    if facts.docker == "client only":
        raise Refused(
            f"cluster '{name}' has the docker CLI but no daemon answered it on {where} {when}: "
            f"start docker there (or add the user to the docker group), then check again{on_nodes}"
        )
    wanted = request.resources.gpu_count
    if wanted and not facts.docker_nvidia:
        raise Refused(
            f"cluster '{name}' has no NVIDIA container runtime {when}, and the request asks for "
            f"{wanted} GPU(s) inside a container"
        )
