"""The request as Slurm sees it: the refusals of what the cluster's last check says it cannot
serve, and the readable sbatch script that runs the bundle's own wrapper. Pure: no I/O."""

from __future__ import annotations

import math
import os
import shlex

from orbit.core.execution.slurm.orphans import comment
from orbit.model.clusters import ClusterFacts, ClusterRecord, SlurmPartition
from orbit.model.errors import Refused
from orbit.model.models import ExecutionRequest

SCRIPT = "scripts/slurm.sbatch"
# Slurm sends its warning of the time limit (--signal) up to this much off the time asked for:
# its limits are looked at on a timer
LIMIT_MARGIN_S = 30
# the result a job's shell writes for a wrapper that ended without one (printf's format)
LOST = (
    '{"state": "failed", "reason": "runtime_lost", '
    '"message": "%s ended (exit %s) without a result"}\\n'
)
# a port free on this node, as the batch shell of a multi-node job finds one on rank 0's
FREE_PORT = 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'


def partition_for(cluster: ClusterRecord) -> SlurmPartition | None:
    facts = cluster.facts
    return facts.partition(cluster.spec.partition) if facts is not None else None


def gpu_type_for(facts: ClusterFacts, partition: SlurmPartition, wanted: str | None) -> str:
    """The GRES type that serves `wanted` on the partition's nodes ('' for any)."""
    if not wanted:
        return ""
    kinds = {k for n in facts.nodes_of(partition) for k in n.gpus if k}
    for kind in sorted(kinds):
        if kind.lower() == wanted.lower() or wanted.lower() in kind.lower():
            return kind
    return ""


def check_request(cluster: ClusterRecord, request: ExecutionRequest) -> None:
    """Refuse, before anything is staged, what the cluster's last check says it cannot run."""
    facts = cluster.facts
    if facts is None:
        return  # never checked: Slurm will say, at sbatch
    when = f"(orbit clusters check {cluster.name}, {facts.checked_at:%Y-%m-%d %H:%M} UTC)"
    wanted = cluster.spec.partition
    partition = facts.partition(wanted)
    if partition is None:
        known = ", ".join(p.name for p in facts.partitions) or "none"
        raise Refused(
            f"cluster '{cluster.name}' has no partition {wanted or '(default)'} {when}; "
            f"it has: {known}"
        )
    where = f"cluster '{cluster.name}' partition {partition.name}"
    nodes = facts.nodes_of(partition)
    res = request.resources
    if request.num_nodes > len(nodes):
        raise Refused(
            f"{where} has {len(nodes)} node(s) {when} and the request asks for "
            f"num_nodes {request.num_nodes}"
        )
    if res.gpu_count:
        if res.gpu_type:
            kind = gpu_type_for(facts, partition, res.gpu_type)
            if not kind:
                kinds = sorted({k or "untyped" for n in nodes for k in n.gpus}) or ["no GPUs"]
                raise Refused(
                    f"{where} has {', '.join(kinds)}, not resources.gpu_type {res.gpu_type} {when}"
                )
            most = max((n.gpus.get(kind, 0) for n in nodes), default=0)
        else:
            most = max((sum(n.gpus.values()) for n in nodes), default=0)
        if res.gpu_count > most:
            raise Refused(
                f"{where}: resources.gpu_count {res.gpu_count} per node requested, its nodes "
                f"have at most {most} {when}"
            )
    most_cpus = max((n.cpus for n in nodes), default=0)
    if res.cpu_count > most_cpus:
        raise Refused(
            f"{where}: resources.cpu_count {res.cpu_count} requested, its nodes have at most "
            f"{most_cpus} {when}"
        )
    most_mb = max((n.memory_mb for n in nodes), default=0)
    if res.memory_gb * 1024 > most_mb:
        raise Refused(
            f"{where}: resources.memory_gb {res.memory_gb:g} requested, its nodes have at most "
            f"{most_mb / 1024:.1f} GB {when}"
        )
    limit = partition.max_time_s
    if request.max_runtime_s and limit is not None and request.max_runtime_s > limit:
        raise Refused(
            f"{where}: max_runtime_s {request.max_runtime_s:g} is above its time limit of "
            f"{limit}s {when}"
        )
    accounts = partition.allow_accounts
    if accounts is not None and cluster.spec.account not in accounts:
        raise Refused(
            f"{where} allows accounts {', '.join(accounts)} only, not "
            f"{cluster.spec.account or '(none given)'} {when}"
        )


def signal_lead_s(request: ExecutionRequest) -> int:
    """How long before Slurm's time limit it warns the batch shell (--signal=B:TERM@lead): the
    stop grace and a margin, so the wrapper has ended the task before the hard kill."""
    return max(1, math.ceil(request.stop_grace_s)) + LIMIT_MARGIN_S


def time_limit_min(request: ExecutionRequest, partition_max_s: int | None = None) -> int | None:
    """Slurm's limit in whole minutes: max_runtime_s, then the warning's lead and Slurm's
    margin, so that the warning never comes before max_runtime_s (a limit of max_runtime_s
    itself would stop a run up to lead + margin seconds early); never above the partition's."""
    if not request.max_runtime_s:
        return None
    minutes = math.ceil((request.max_runtime_s + signal_lead_s(request) + LIMIT_MARGIN_S) / 60)
    if partition_max_s is not None:
        minutes = min(minutes, max(1, partition_max_s // 60))
    return minutes


def python_lines(cluster: ClusterRecord) -> list[str]:
    """The wrapper's interpreter: the cluster's python as the last check resolved it (no
    version manager's shim in front of each job), where the node has that file."""
    q = shlex.quote
    python = cluster.spec.python
    found = cluster.facts.python_path if cluster.facts is not None else None
    if not found or found == python:
        return [f"python={q(python)}"]
    return [f"python={q(found)}", f'[ -x "$python" ] || python={q(python)}']


def sbatch_script(
    cluster: ClusterRecord,
    request: ExecutionRequest,
    *,
    run_id: str,
    attempt_id: str,
    location: str,
    env: dict[str, str],
    frozen: str,
    plane: str = "",
    secrets: bool = False,
) -> str:
    """scripts/slurm.sbatch of one attempt: #SBATCH lines from the request, then the bundle's
    own wrapper in the foreground. Slurm's warning of the time limit (--signal=B:TERM) is told
    apart from any other TERM (scancel from outside, a preemption) by when it comes.

    A run of N nodes is one job of N nodes: the batch shell finds rank 0's address, and srun
    runs this same script once per node (`--node`), which starts the wrapper there with
    ORBIT_NODE_RANK, ORBIT_NUM_NODES and ORBIT_MASTER_ADDR/PORT from Slurm's environment:
    rank 0 in the attempt's folder, each other rank in nodes/RANK/, its own copy of the frozen
    bundle (`frozen`, the cluster's cached one) with its own runtime/ and artifacts/.

    With `secrets`, each rank's wrapper reads its file of them (secrets/rank-N.json, which
    the launch wrote and the wrapper deletes as it reads it); the job removes what is left."""
    spec, res = cluster.spec, request.resources
    partition = partition_for(cluster)
    q = shlex.quote
    nodes = request.num_nodes
    lines = [
        "#!/bin/bash",
        f"# ORBIT run {run_id}, attempt {attempt_id}: generated from the run's request, kept in",
        "# the attempt's copy of the bundle. It runs the bundle's own runtime wrapper, which",
        "# writes runtime/ and artifacts/ as on any other placement.",
        f"#SBATCH --job-name=orbit-{attempt_id}",
        f"#SBATCH --comment={comment(run_id, attempt_id, plane)}",
        f"#SBATCH --chdir={location}",
        f"#SBATCH --output={location}/runtime/slurm-%j.out",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    part = spec.partition or (partition.name if partition is not None else None)
    if spec.partition:
        lines.append(f"#SBATCH --partition={spec.partition}")
    if spec.account:
        lines.append(f"#SBATCH --account={spec.account}")
    if res.cpu_count:
        lines.append(f"#SBATCH --cpus-per-task={res.cpu_count}")
    if res.memory_gb:
        lines.append(f"#SBATCH --mem={math.ceil(res.memory_gb * 1024)}M")
    if res.gpu_count:
        kind = ""
        if cluster.facts is not None and partition is not None:
            kind = gpu_type_for(cluster.facts, partition, res.gpu_type)
        lines.append(f"#SBATCH --gres=gpu:{kind + ':' if kind else ''}{res.gpu_count}")
    minutes = time_limit_min(request, partition.max_time_s if partition is not None else None)
    if minutes is not None:
        lines.append(f"#SBATCH --time={minutes}")
    lines.append(f"#SBATCH --signal=B:TERM@{signal_lead_s(request)}")
    lines.append("#SBATCH --requeue" if request.preemptible else "#SBATCH --no-requeue")
    exports = " ".join(f"{k}={q(v)}" for k, v in sorted(env.items()))
    max_s = math.ceil(request.max_runtime_s) if request.max_runtime_s else 0
    lines += [
        "",
        f"bundle={q(location)}",
        f"export {exports} ORBIT_SLURM_PARTITION={q(part or '')}",
        f"max_s={max_s}",
        "SECONDS=0",
        *python_lines(cluster),
        "",
        "# a wrapper that ended without its result (killed, or never started): what it left of",
        "# its task on this node is stopped (hostside's probe, as ORBIT's own look would), and",
        "# its runtime/ says so rather than staying silent",
        "no_result() {  # FOLDER WHO EXIT [RANK]",
        '  [ -d "$1/runtime" ] && [ ! -e "$1/runtime/result.json" ] || return 0',
        '  "$python" -S "$1/scripts/orbit_hostside.py" probe "$1" "$ORBIT_ATTEMPT_ID" \\',
        '    ${4:+"$4"} >/dev/null 2>&1',
        f'  printf {q(LOST)} "$2" "$3" > "$1/runtime/result.json"',
        "}",
        "",
    ]
    if nodes > 1:
        lines += _node_lines(frozen, secrets)
    lines += [
        "on_term() {",
        "  # the time limit's warning (it comes past max_runtime_s, give or take Slurm's margin):",
        "  # the wrapper ends the attempt as max_runtime; any earlier TERM is a preemption",
        "  # ($SECONDS: bash's own count of seconds since it was set, without a date process)",
        f'  if [ "$max_s" -gt 0 ] && [ "$SECONDS" -ge $(( max_s - {LIMIT_MARGIN_S} )) ] \\',
        '     && [ ! -e "$bundle/runtime/stop_request.json" ]; then',
        '    printf \'{"reason": "max_runtime", "message": "Slurm time limit"}\\n\' \\',
        '      > "$bundle/runtime/stop_request.json"',
        "  fi",
    ]
    if nodes == 1:
        lines += [
            '  kill -TERM "$pid" 2>/dev/null',
            "}",
            "trap on_term TERM",
            "",
            '"$python" -S "$bundle/scripts/orbit_wrapper.py" --bundle "$bundle"'
            + (' --secrets "$bundle/secrets/rank-0.json"' if secrets else "")
            + " &",
        ]
    else:
        cpus = f" --cpus-per-task={res.cpu_count}" if res.cpu_count else ""
        lines += [
            "  # every rank's wrapper is told why, then TERMed through Slurm (srun itself would",
            "  # take a TERM as the order to kill its tasks outright)",
            '  if [ -e "$bundle/runtime/stop_request.json" ]; then',
            '    for d in "$bundle"/nodes/*/runtime; do',
            '      [ -d "$d" ] && cp "$bundle/runtime/stop_request.json" "$d/"',
            "    done",
            "  fi",
            '  for step in $(squeue -h -s -j "$SLURM_JOB_ID" -o %i 2>/dev/null); do',
            '    case $step in *.[0-9]*) scancel --signal=TERM "$step" 2>/dev/null ;; esac',
            "  done",
            "}",
            "trap on_term TERM",
            "",
            "# rank 0's address as Slurm reaches it (its NodeAddr), and a port free there (this",
            "# shell runs on rank 0's node, the job's first; else one of 20000-31999 by job id)",
            "first=${SLURMD_NODENAME:-"
            '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}',
            "addr=$(scontrol -o show node \"$first\" | sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p')",
            f'port=$("$python" -S -c {q(FREE_PORT)} 2>/dev/null)',
            'export ORBIT_MASTER_ADDR="${addr:-$first}"'
            ' ORBIT_MASTER_PORT="${port:-$(( 20000 + SLURM_JOB_ID % 12000 ))}"',
            "# one wrapper per node, with the whole of its node's share (srun does not pass",
            "# the job's --cpus-per-task on to a step by itself)",
            f"srun --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1{cpus} \\",
            '  --kill-on-bad-exit=0 bash "$bundle/scripts/slurm.sbatch" --node &',
        ]
    who = "the wrapper" if nodes == 1 else "srun, for rank 0,"
    lines += [
        "pid=$!",
        'while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done',
        'wait "$pid"',
        "code=$?",
        f'no_result "$bundle" {q(who)} "$code"{"" if nodes == 1 else " 0"}',
        *(['rm -rf "$bundle/secrets"  # what a wrapper never read'] if secrets else []),
        'exit "$code"',
        "",
    ]
    return "\n".join(lines)


def _node_lines(frozen: str, secrets: bool = False) -> list[str]:
    """The part srun runs on each node of a multi-node job."""
    return [
        'if [ "${1:-}" = "--node" ]; then',
        "  # srun: this node's wrapper. Rank 0 runs in the attempt's folder; every other rank in",
        "  # nodes/RANK/, a copy of the frozen bundle with a runtime/ and artifacts/ of its own,",
        "  # checked against the bundle's digest as it is made (by rank 0's checked hostside)",
        '  export ORBIT_NODE_RANK="$SLURM_NODEID" ORBIT_NUM_NODES="$SLURM_JOB_NUM_NODES"',
        '  dir="$bundle"',
        '  if [ "$SLURM_NODEID" -gt 0 ]; then',
        '    dir="$bundle/nodes/$SLURM_NODEID"',
        '    if [ ! -d "$dir/runtime" ]; then',
        f"      frozen={shlex.quote(frozen)}",
        '      mkdir -p "$bundle/nodes" || exit 1',
        '      made=$("$python" -S "$bundle/scripts/orbit_hostside.py" copy "$frozen" "$dir" \\',
        f"        {shlex.quote(os.path.basename(frozen))}) || exit 1",
        '      case "$made" in',
        '        *\\"error\\"*) echo "orbit: rank $SLURM_NODEID: $made" >&2; exit 1 ;;',
        "      esac",
        "    fi",
        "    # a stop asked before this rank's folder was there: the wrapper ends at its start",
        '    [ -e "$bundle/runtime/stop_request.json" ] \\',
        '      && [ ! -e "$dir/runtime/stop_request.json" ] \\',
        '      && cp "$bundle/runtime/stop_request.json" "$dir/runtime/"',
        "  fi",
        "  trap : TERM  # the wrapper takes the stop; this shell outlives it, to say if it died",
        '  "$python" -S "$dir/scripts/orbit_wrapper.py" --bundle "$dir"'
        + (' --secrets "$bundle/secrets/rank-$SLURM_NODEID.json"' if secrets else ""),
        "  code=$?",
        '  no_result "$dir" "the wrapper of rank $SLURM_NODEID on $SLURMD_NODENAME" "$code" \\',
        '    "$SLURM_NODEID"',
        '  exit "$code"',
        "fi",
        "",
    ]
