"""`orbit clusters`: Slurm clusters runs can target (template slurm, --set target=NAME)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from orbit.cli.common import JSON, OUTPUT, console, emitted, err, output_format, print_json, service
from orbit.cli.text import paint

if TYPE_CHECKING:
    from orbit.model.clusters import ClusterCheck, ClusterFacts, ClusterRecord, SlurmOrphan

clusters_app = typer.Typer(
    help="Slurm clusters that runs can target: add one, then submit with --template slurm "
    "--set target=NAME.",
    no_args_is_help=True,
)
NAME = typer.Argument(..., metavar="NAME", help="The cluster's name in ORBIT, e.g. hpc.")


def cluster_json(cluster: ClusterRecord) -> dict[str, Any]:
    return cluster.model_dump(mode="json")


def _limit(seconds: int | None) -> str:
    if seconds is None:
        return "no limit"
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def _gpus(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} x {kind or 'gpu'}" for kind, n in sorted(counts.items())) or "none"


def describe(facts: ClusterFacts) -> list[tuple[str, str]]:
    rows = [
        (
            "checked",
            f"{facts.checked_at:%Y-%m-%d %H:%M} UTC (Slurm {facts.version}, {facts.source})",
        ),
        ("work dir", facts.work_dir or "?"),
        (
            "docker",
            (facts.docker or "none")
            + (" (nvidia runtime)" if facts.docker_nvidia else "")
            + (f", on {facts.docker_where}" if facts.docker_where else ""),
        ),
    ]
    for p in facts.partitions:
        nodes = facts.nodes_of(p)
        gpus: dict[str, int] = {}
        for n in nodes:
            for kind, count in n.gpus.items():
                gpus[kind] = max(gpus.get(kind, 0), count)
        accounts = f", accounts {','.join(p.allow_accounts)}" if p.allow_accounts else ""
        rows.append(
            (
                f"partition {p.name}" + ("*" if p.default else ""),
                f"{p.state.lower()}, {len(nodes)} node(s), GPUs per node {_gpus(gpus)}, "
                f"time limit {_limit(p.max_time_s)}{accounts}",
            )
        )
    for n in facts.nodes:
        rows.append(
            (
                f"node {n.name}",
                f"{n.state.lower()}, {n.cpus} CPUs, {n.memory_mb} MB, GPUs {_gpus(n.gpus)}",
            )
        )
    return rows


def show_cluster(cluster: ClusterRecord) -> None:
    spec = cluster.spec
    where = "this machine" if spec.local else f"ssh {spec.ssh.ssh if spec.ssh else '?'}"
    console.print(f"{paint(spec.name, 'bold')}  slurm on {where}")
    rows = [
        ("partition", spec.partition or "(the cluster's default)"),
        ("account", spec.account or "-"),
        ("work dir", spec.work_dir),
        ("slurm.conf", spec.slurm_conf or "(Slurm's default)"),
    ]
    rows += describe(cluster.facts) if cluster.facts else [("checked", "never")]
    for label, value in rows:
        console.print(f"  {label + ':':<19}{value}")


@clusters_app.command("add")
def clusters_add(
    name: str = NAME,
    local: bool = typer.Option(
        False, "--local", help="This machine is a submit host of the cluster."
    ),
    ssh: str | None = typer.Option(
        None,
        "--ssh",
        metavar="USER@LOGIN|ALIAS",
        help="Submit through this login node, as `orbit hosts add --ssh` reaches a host.",
    ),
    port: int | None = typer.Option(None, "--port", "-p", help="SSH port of the login node."),
    identity: str | None = typer.Option(
        None, "--identity", "-i", metavar="KEY", help="Private key for the login node."
    ),
    partition: str | None = typer.Option(
        None, "--partition", help="Partition for its jobs (default: the cluster's default)."
    ),
    account: str | None = typer.Option(None, "--account", help="Account to charge (-A)."),
    work_dir: str = typer.Option(
        ".orbit-work",
        "--work-dir",
        help="Where bundles and attempts live, on a filesystem the compute nodes share "
        "(relative: under the home directory).",
    ),
    slurm_conf: str | None = typer.Option(
        None, "--slurm-conf", metavar="PATH", help="SLURM_CONF for Slurm's commands there."
    ),
    python: str = typer.Option("python3", "--python", help="python3 on the compute nodes."),
    accept_new_host_key: bool = typer.Option(
        False, "--accept-new-host-key", help="Trust the login node's key the first time."
    ),
    docker_on_nodes: bool = typer.Option(
        False,
        "--docker-on-nodes",
        help="Look for docker (template slurm-docker) on a compute node, through one short "
        "job at each check (srun, waiting 30 s at most for a node), not where jobs are "
        "submitted.",
    ),
    check: bool = typer.Option(
        True, "--check/--no-check", help="Ask Slurm first; do not add it if that fails."
    ),
    as_json: bool = JSON,
) -> None:
    """Register a Slurm cluster; it is checked first (partitions, nodes, GPUs, limits).

    \b
    orbit clusters add hpc --ssh login.hpc.example.org --partition gpu --account proj42
    orbit clusters add here --local
    orbit submit spec.yaml --template slurm --set target=hpc
    """
    from pydantic import ValidationError

    from orbit.model.clusters import ClusterSpec
    from orbit.model.errors import InvalidInput, describe_validation_error
    from orbit.model.hosts import HostSpec

    try:
        login = None
        if ssh is not None:
            login = HostSpec(
                name=name,
                ssh=ssh,
                port=port,
                identity=identity,
                accept_new_host_key=accept_new_host_key,
            )
        spec = ClusterSpec(
            name=name,
            local=local,
            ssh=login,
            partition=partition,
            account=account,
            work_dir=work_dir,
            slurm_conf=slurm_conf,
            python=python,
            docker_on_nodes=docker_on_nodes,
        )
    except ValidationError as exc:
        raise InvalidInput(describe_validation_error("clusters add", exc)) from None
    cluster = service().add_cluster(spec, check=check)
    if as_json:
        print_json(cluster_json(cluster))
        return
    console.print(f"added cluster {cluster.name}")
    show_cluster(cluster)


@clusters_app.command("list")
def clusters_list(as_json: bool = JSON, output: str | None = OUTPUT) -> None:
    """List registered clusters with what their last check found."""
    from orbit.cli import render

    fmt = output_format(as_json, output)
    clusters = service().list_clusters()
    if emitted(fmt, lambda: [cluster_json(c) for c in clusters], "name"):
        return
    table = render.table("NAME", "WHERE", "PARTITIONS", "NODES", "GPUS", "SLURM", "CHECKED")
    for c in clusters:
        where = "local" if c.spec.local else (c.spec.ssh.ssh if c.spec.ssh else "?")
        f = c.facts
        if f is None:
            table.add_row(c.name, where, "?", "?", "?", "?", "never")
            continue
        gpus: dict[str, int] = {}
        for n in f.nodes:
            for kind, count in n.gpus.items():
                gpus[kind] = gpus.get(kind, 0) + count
        table.add_row(
            c.name,
            where,
            ",".join(p.name + ("*" if p.default else "") for p in f.partitions),
            str(len(f.nodes)),
            _gpus(gpus),
            f.version,
            f"{f.checked_at:%Y-%m-%d %H:%M}",
        )
    console.print(table)


@clusters_app.command("show")
def clusters_show(name: str = NAME, as_json: bool = JSON) -> None:
    """One cluster: how it is reached and what its last check found."""
    cluster = service().get_cluster(name)
    if as_json:
        print_json(cluster_json(cluster))
    else:
        show_cluster(cluster)


WHY = {
    "unknown": "this control plane has no such attempt",
    "ended": "its attempt has ended",
    "other_plane": "another control plane's: left alone",
}


def show_orphans(checked: ClusterCheck) -> None:
    from orbit.cli import render

    if not checked.orphans:
        console.print("ORBIT jobs in Slurm that this control plane does not know: none")
        return
    table = render.table("JOB", "STATE", "RUN", "ATTEMPT", "WHY", "CANCELLED")
    for o in checked.orphans:
        table.add_row(
            o.job_id, o.state, o.run_id, o.attempt_id, WHY[o.why], "yes" if o.cancelled else "no"
        )
    console.print(
        f"ORBIT jobs in Slurm that this control plane does not know: {len(checked.orphans)}"
    )
    console.print(table)
    if not checked.swept and any(o.why != "other_plane" for o in checked.orphans):
        console.print(f"cancel them with: orbit clusters check {checked.cluster.name} --sweep")


def orphan_json(orphan: SlurmOrphan) -> dict[str, Any]:
    return orphan.model_dump(mode="json")


@clusters_app.command("check")
def clusters_check(
    name: str = NAME,
    sweep: bool = typer.Option(
        False,
        "--sweep",
        help="Cancel this control plane's ORBIT jobs in Slurm that no live attempt owns.",
    ),
    as_json: bool = JSON,
) -> None:
    """Ask Slurm again (sinfo, scontrol) and record partitions, nodes, GRES, limits, version;
    list ORBIT's jobs in its queue that the control plane does not know.

    Submissions are refused against what it records: a GPU type no node of the partition
    has, more GPUs per node than any node has, a time above the partition's limit. ORBIT's
    jobs are those with both its marks (job name orbit-ATTEMPT, comment orbit:run=...);
    no other job is listed or touched, and the listed ones are cancelled only with --sweep.
    """
    checked = service().check_cluster(name, sweep=sweep)
    if as_json:
        print_json(
            {
                **cluster_json(checked.cluster),
                "orphans": [orphan_json(o) for o in checked.orphans],
                "swept": checked.swept,
                "sweep_error": checked.sweep_error,
            }
        )
    else:
        show_cluster(checked.cluster)
        show_orphans(checked)
    if checked.sweep_error:
        err.print(f"orbit: the sweep failed: {checked.sweep_error}")
        raise typer.Exit(1)


@clusters_app.command("remove")
def clusters_remove(name: str = NAME) -> None:
    """Forget a cluster. Runs on it are not touched and can still be followed and collected."""
    active = service().remove_cluster(name)
    console.print(f"removed cluster {name}")
    if active:
        err.print(
            f"note: {len(active)} run(s) still active there ({', '.join(active)}); "
            "they keep what they need to be followed, cancelled and collected",
        )
