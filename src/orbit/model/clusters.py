"""Slurm clusters as the control plane records them: how one is reached (ClusterSpec), what its
last check found (ClusterFacts) and the registry's record of both. Pure records.

A cluster is kept in the store's `hosts` table beside the SSH hosts (one name space: a target
names one or the other); its spec says `kind: slurm`, which a host's never does."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from pydantic import Field, field_validator, model_validator

from orbit.model.hosts import HostSpec, registered_name
from orbit.model.models import Record, Strict

CLUSTER_KIND = "slurm"


class ClusterSpec(Strict):
    """A registered Slurm cluster, reached either on this machine (`local`: the control plane
    runs on a submit host) or through a login node over SSH (`ssh`, as a host is)."""

    kind: Literal["slurm"] = "slurm"
    name: str
    local: bool = False
    ssh: HostSpec | None = None  # the login node; its work_dir is the cluster's
    partition: str | None = None  # default: the cluster's default partition
    account: str | None = None
    work_dir: str = Field(default=".orbit-work", min_length=1)  # shared with the compute nodes
    slurm_conf: str | None = None  # SLURM_CONF for Slurm's commands there (default: theirs)
    python: str = Field(default="python3", min_length=1)
    # look for docker on a compute node (one short job through srun at each check) rather
    # than where the jobs are submitted: for clusters whose login node has no docker
    docker_on_nodes: bool = False

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return registered_name(value)

    @field_validator("partition", "account", "work_dir", "slurm_conf", "python")
    @classmethod
    def _word(cls, value: str | None) -> str | None:
        if value is not None and (re.search(r"[\s'\"\\$`;|&<>]", value) or value.startswith("-")):
            raise ValueError("must be one word: no spaces, quotes or shell characters")
        return value

    @model_validator(mode="after")
    def _one_way_in(self) -> ClusterSpec:
        if self.local == (self.ssh is not None):
            raise ValueError("give exactly one of --local or --ssh HOST")
        return self


class SlurmNode(Record):
    name: str
    state: str
    cpus: int
    memory_mb: int
    gpus: dict[str, int] = {}  # GPU type (or "" when Slurm names none) -> count
    partitions: tuple[str, ...] = ()


class SlurmPartition(Record):
    name: str
    state: str
    default: bool = False
    nodes: tuple[str, ...] = ()
    max_time_s: int | None = None  # None: no limit
    allow_accounts: tuple[str, ...] | None = None  # None: all


class ClusterFacts(Record):
    """What `orbit clusters check` found, as of `checked_at`."""

    checked_at: datetime
    version: str
    source: str  # how the nodes were read: "sinfo --json" or "scontrol"
    partitions: tuple[SlurmPartition, ...] = ()
    nodes: tuple[SlurmNode, ...] = ()
    work_dir: str | None = None  # absolute, on the cluster
    # where spec.python, a name looked up on PATH, led at the check (pyenv's shim, a bash
    # script, costs ~0.15 s a start): the jobs start the wrapper with it where it exists
    python_path: str | None = None
    # the docker CLI where it was looked for (docker_where): the server's version, "client
    # only" (no daemon answered), or None (no docker there)
    docker: str | None = None
    docker_nvidia: bool = False  # an NVIDIA container runtime (or NVIDIA's hook) is there
    # "this machine" (--local), "the login node", or "node NAME" (docker_on_nodes: a job's)
    docker_where: str | None = None

    def partition(self, name: str | None) -> SlurmPartition | None:
        for p in self.partitions:
            if p.name == name or (name is None and p.default):
                return p
        return None

    def nodes_of(self, partition: SlurmPartition) -> list[SlurmNode]:
        return [n for n in self.nodes if n.name in partition.nodes]


class ClusterRecord(Record):
    spec: ClusterSpec
    facts: ClusterFacts | None = None
    created_at: datetime
    created_by: str

    @property
    def name(self) -> str:
        return self.spec.name


class SlurmOrphan(Record):
    """A job in Slurm carrying ORBIT's marks (job name `orbit-ATTEMPT`, comment
    `orbit:run=RUN,attempt=ATTEMPT[,plane=PLANE]`) that no live attempt of this control plane
    owns. `why`: `unknown` (this control plane has no such attempt), `ended` (its attempt has
    ended, the job has not), `other_plane` (another control plane's: listed, never cancelled)."""

    job_id: str
    state: str
    run_id: str
    attempt_id: str
    plane: str | None = None
    why: Literal["unknown", "ended", "other_plane"]
    cancelled: bool = False


class ClusterCheck(Record):
    """What `clusters check` found: the cluster's facts now, and the ORBIT jobs in its queue
    that this control plane does not recognize (cancelled where the check swept)."""

    cluster: ClusterRecord
    orphans: tuple[SlurmOrphan, ...] = ()
    swept: bool = False
    sweep_error: str | None = None
