"""`slurm_docker`: the Slurm placement with the docker launch mode. The refusals from the
cluster's recorded facts (no Slurm needed), and one container run on the private Slurm
(tests/slurm.py) against the private dockerd (tests/dockerd.py), reached through DOCKER_HOST,
which sbatch passes on to the job."""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from tests.dockerd import Dockerd
from tests.helpers import orbit, orbit_json, write_spec
from tests.slurm import NODES, SlurmCluster

from orbit.core.execution.backends.slurm_docker import SlurmDockerBackend
from orbit.core.execution.slurm.facts import parse_docker
from orbit.core.execution.ssh.transport import SshOptions
from orbit.model.clusters import ClusterFacts, ClusterRecord, ClusterSpec, SlurmNode, SlurmPartition
from orbit.model.errors import Refused
from orbit.model.models import ExecutionRequest
from orbit.model.overrides import parse_overrides, resolve
from orbit.model.templates import TemplateRegistry, builtin_dir


class Clusters:
    def __init__(self, record: ClusterRecord) -> None:
        self.record = record

    def find(self, name: str) -> ClusterRecord | None:
        return self.record if name == self.record.name else None


def cluster(docker: str | None, nvidia: bool = False, on_nodes: bool = False) -> ClusterRecord:
    facts = ClusterFacts(
        checked_at=datetime(2025, 1, 2, 3, 4, tzinfo=UTC),
        version="22.05.8",
        source="sinfo --json",
        partitions=(SlurmPartition(name="debug", state="UP", default=True, nodes=("n1",)),),
        nodes=(SlurmNode(name="n1", state="IDLE", cpus=8, memory_mb=64000, gpus={"a100": 2}),),
        docker=docker,
        docker_nvidia=nvidia,
        docker_where="node n1" if on_nodes else "this machine",
    )
    return ClusterRecord(
        spec=ClusterSpec(name="hpc", local=True, docker_on_nodes=on_nodes),
        facts=facts,
        created_at=datetime.now(UTC),
        created_by="tester",
    )


def request(gpu_count: int = 0) -> ExecutionRequest:
    template = TemplateRegistry([builtin_dir()]).get("slurm-docker")
    raw: dict[str, Any] = {
        "target": "hpc",
        "image": "python:3.12",
        "resources": {"gpu_count": gpu_count},
    }
    return resolve(template, parse_overrides(raw, "spec"))


def validate(record: ClusterRecord, gpu_count: int = 0) -> None:
    backend = SlurmDockerBackend(Clusters(record), SshOptions())
    req = request(gpu_count)
    assert req.backend_key == backend.key == "slurm_docker"
    backend.validate(req)


@pytest.mark.parametrize(
    ("docker", "nvidia", "gpus", "found"),
    [
        (
            None,
            False,
            0,
            "'hpc' has no docker on this machine (orbit clusters check hpc, 2025-01-02",
        ),
        ("client only", False, 0, "cluster 'hpc' has the docker CLI but no daemon answered it on"),
        ("27.1.1", False, 1, "cluster 'hpc' has no NVIDIA container runtime (orbit clusters"),
    ],
)
def test_a_cluster_whose_last_check_found_no_usable_docker_is_refused_in_one_line(
    docker: str | None, nvidia: bool, gpus: int, found: str
) -> None:
    with pytest.raises(Refused) as refused:
        validate(cluster(docker, nvidia), gpus)
    assert found in str(refused.value) and "\n" not in str(refused.value)
    if docker in (None, "client only"):  # the way to look on the compute nodes instead
        assert "add it again with --docker-on-nodes" in str(refused.value)
        with pytest.raises(Refused) as on_nodes:
            validate(cluster(docker, nvidia, on_nodes=True), gpus)
        assert " on node n1 (orbit clusters check" in str(on_nodes.value)
        assert "--docker-on-nodes" not in str(on_nodes.value)


def test_a_cluster_with_docker_is_accepted_and_gpus_need_its_nvidia_runtime() -> None:
    validate(cluster("27.1.1"))
    validate(cluster("27.1.1", nvidia=True), 2)
    with pytest.raises(Refused, match="gpu_count 3"):  # the Slurm checks still apply
        validate(cluster("27.1.1", nvidia=True), 3)


def test_the_docker_probe_output_is_parsed() -> None:
    assert parse_docker("") == (None, False)
    assert parse_docker("docker=client only\n") == ("client only", False)
    assert parse_docker("docker=27.1.1\ndocker_nvidia=1\n") == ("27.1.1", True)


def test_a_container_run_on_the_private_slurm(
    orbit_home: Path, tmp_path: Path, slurm: SlurmCluster, dockerd: Dockerd
) -> None:
    env = {
        **os.environ,
        "ORBIT_HOME": str(orbit_home),
        "ORBIT_DATABASE_URL": f"sqlite:///{tmp_path / 'orbit.db'}",
        "DOCKER_HOST": dockerd.host,  # as the cluster's own setup would give its jobs
        "COLUMNS": "200",
    }
    work = tmp_path / "cluster-work"
    add = ["clusters", "add", "here", "--local", "--slurm-conf", str(slurm.conf)]
    added = orbit_json(env, *add, "--work-dir", str(work))
    assert added["facts"]["docker"] and added["facts"]["docker"] != "client only"
    shown = orbit(env, "clusters", "show", "here").stdout
    assert added["facts"]["docker_where"] == "this machine"
    version = re.escape(added["facts"]["docker"])
    assert re.search(rf"docker: +{version}, on this machine\n", shown), shown
    folder = tmp_path / "job"
    folder.mkdir()
    spec = write_spec(
        folder,
        template="slurm-docker",
        task={"command": ["sh", "-c", 'echo "in a container under Slurm: $ORBIT_ATTEMPT_ID"']},
        overrides={"target": "here", "image": dockerd.image},
    )
    run = orbit_json(env, "submit", str(spec), "--wait")
    attempt = run["attempts"][0]
    assert run["state"] == "succeeded", attempt
    assert attempt["handle"]["backend_key"] == "slurm_docker"
    location = Path(attempt["handle"]["location"])
    assert (location / "scripts" / "slurm.sbatch").is_file()
    training = (location / "artifacts" / "training.log").read_text()
    assert f"in a container under Slurm: {attempt['id']}" in training
    image = json.loads((location / "runtime" / "image.json").read_text())
    assert image["id"] == dockerd.image_id(dockerd.image)
    assert not dockerd.containers(f"label=orbit.attempt={attempt['id']}")  # none left behind

    no_docker = {**env, "DOCKER_HOST": f"unix://{tmp_path / 'no-docker.sock'}"}
    checked = orbit_json(no_docker, "clusters", "check", "here")
    assert checked["facts"]["docker"] == "client only"
    refused = orbit(no_docker, "submit", str(spec), check=False)
    assert refused.returncode == 2
    assert "cluster 'here' has the docker CLI but no daemon answered it" in refused.stderr


def test_a_container_on_each_node_of_a_two_node_job(
    orbit_home: Path, tmp_path: Path, slurm: SlurmCluster, dockerd: Dockerd
) -> None:
    """num_nodes 2: each node's wrapper runs its own container (named by its rank, as both
    nodes share this machine's dockerd here), told its rank and the gang's rendezvous."""
    env = {
        **os.environ,
        "ORBIT_HOME": str(orbit_home),
        "ORBIT_DATABASE_URL": f"sqlite:///{tmp_path / 'orbit.db'}",
        "DOCKER_HOST": dockerd.host,
    }
    add = ["clusters", "add", "multi", "--local", "--partition", "multi"]
    orbit_json(env, *add, "--slurm-conf", str(slurm.conf), "--work-dir", str(tmp_path / "w"))
    folder = tmp_path / "job"
    folder.mkdir()
    # both at once (a container name taken twice would fail one)
    say = 'echo "rank $ORBIT_NODE_RANK of $ORBIT_NUM_NODES, container n$ORBIT_NODE"; sleep 1'
    spec = write_spec(
        folder,
        template="slurm-docker",
        task={"command": ["sh", "-c", say]},
        overrides={"target": "multi", "image": dockerd.image, "num_nodes": 2},
    )
    run = orbit_json(env, "submit", str(spec), "--wait")
    attempt = run["attempts"][0]
    assert run["state"] == "succeeded", attempt
    location = Path(attempt["handle"]["location"])
    for rank, folder in enumerate((location, location / "nodes" / "1")):
        training = (folder / "artifacts" / "training.log").read_text()
        assert f"rank {rank} of 2, container n{rank}" in training, training
    assert not dockerd.containers(f"label=orbit.attempt={attempt['id']}")


def test_docker_on_the_compute_nodes_is_looked_for_through_a_job(
    orbit_home: Path, tmp_path: Path, slurm: SlurmCluster, dockerd: Dockerd
) -> None:
    """--docker-on-nodes: the check runs its docker probe as one short job on a node of the
    partition (the jobs' docker, reached here through DOCKER_HOST as a node's setup would)."""
    env = {
        **os.environ,
        "ORBIT_HOME": str(orbit_home),
        "ORBIT_DATABASE_URL": f"sqlite:///{tmp_path / 'orbit.db'}",
        "DOCKER_HOST": dockerd.host,
        "COLUMNS": "200",
    }
    add = ["clusters", "add", "hpc", "--local", "--partition", "multi", "--docker-on-nodes"]
    added = orbit_json(env, *add, "--slurm-conf", str(slurm.conf), "--work-dir", str(tmp_path))
    facts = added["facts"]
    assert facts["docker_where"] in {f"node {n}" for n in NODES}, facts
    assert facts["docker"] and facts["docker"] != "client only"
    assert slurm.queue() == []  # the probe's job has ended
    # no daemon for the nodes' jobs: said as found on that node, and the submission refused
    no_daemon = {**env, "DOCKER_HOST": f"unix://{tmp_path / 'no-docker.sock'}"}
    checked = orbit_json(no_daemon, "clusters", "check", "hpc")["facts"]
    assert checked["docker"] == "client only" and checked["docker_where"].startswith("node ")
    # no node free for the probe: the check fails in one line with Slurm's reason
    for node in NODES:
        slurm.set_node("drain", node=node)
    try:
        busy = orbit(env, "clusters", "check", "hpc", check=False, timeout=180)
    finally:
        for node in NODES:
            slurm.set_node("resume", node=node)
    assert busy.returncode != 0 and len(busy.stderr.strip().splitlines()) == 1, busy.stderr
    assert "the docker probe's job (srun on multi) did not run" in busy.stderr
