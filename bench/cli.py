"""Benchmark: how fast the `orbit` CLI answers, beside Slurm's commands and `python3 -c pass`.

Run from the repository root:

    .venv/bin/python bench/cli.py                # 1,000 runs in the store, 10 runs each
    .venv/bin/python bench/cli.py --runs 200 --repeat 5 --json

A fresh ORBIT_HOME (SQLite, under a temporary folder) is filled with --runs runs of the
example's kind, all ended but the newest (running on this machine, so that `runs list` and
`status` also refresh one live attempt as they would for a user). Then each command is run
--repeat times as a new process, as a user's shell runs it, after one untimed warm-up run:

    orbit --help
    orbit runs list              (the newest 50, with "50 of N runs")
    orbit status RUN             (the running run: refreshed from where it runs)
    orbit queue                  (nothing waits: the cost of asking)
    orbit nodes list             (no nodes: the cost of asking)
    complete `orbit status run-` (the shell's completion of a run id, as bash asks for it)
    python3 -c pass              (the interpreter's own start: the floor)

and beside them, in the same run, the peer: a private single-node Slurm (bench/api.py's, on
loopback with its own munged) holding --runs held jobs (`sbatch --hold`), where `squeue`,
`squeue -j ID` and `sinfo` are timed the same way. Without root or slurm-wlm, or with
--no-slurm, Slurm's lines are left out with a line saying why.

Modules run from their compiled bytecode, as an installed ORBIT's do (the warm-up run writes
it where PYTHONDONTWRITEBYTECODE would have kept it from being written).

Reported: the median and the slowest wall time in milliseconds. Goals (issue 31): median
<= 120 ms for the commands, <= 150 ms for a completion.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orbit.model.models import (
    ExecutionRequest,
    FailureReason,
    LaunchMode,
    Placement,
    Resources,
    RunState,
    TaskSubmission,
)
from orbit.store import Store


def fill(store: Store, runs: int) -> None:
    """`runs` runs, as ended ones (a fifth failed) of two experiments."""
    experiments = [
        store.experiments.create_experiment(name, "bench").id for name in ("sft", "grpo")
    ]
    request = ExecutionRequest(
        template_id="local",
        placement=Placement(kind="local"),
        launch_mode=LaunchMode(kind="host_process"),
        target="localhost",
        detach=True,
        resources=Resources(),
        runtime_env={},
        stop_grace_s=10,
    )
    for i in range(runs):
        submission = TaskSubmission(
            experiment_id=experiments[i % 2],
            task_type="python",
            task_request={"script": "train.py"},
            template_id="local",
        )
        run = store.runs.create_run(
            experiment_id=experiments[i % 2],
            task_type="python",
            template_id="local",
            bundle_digest=f"{i:064x}",
            submission=submission,
            request=request,
            actor="bench",
        )
        attempt = run.current.id
        if i % 5 == 4:
            store.attempts.move_attempt(
                attempt,
                RunState.FAILED,
                actor="bench",
                reason=FailureReason.TASK_EXIT_NONZERO,
                exit_code=1,
            )
        else:
            store.attempts.move_attempt(attempt, RunState.SUCCEEDED, actor="bench", exit_code=0)


def timed(argv: list[str], env: dict[str, str], repeat: int) -> list[float]:
    subprocess.run(argv, env=env, check=True, capture_output=True)  # warm-up, untimed
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True)
        times.append((time.perf_counter() - start) * 1000)
    return times


def slurm_figures(jobs: int, repeat: int, no_slurm: bool) -> tuple[dict[str, list[float]], str]:
    """Slurm's commands timed beside ORBIT's: `jobs` held jobs queued, then squeue, squeue -j
    and sinfo; or nothing, and why."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from api import Slurm, slurm_missing

    why = slurm_missing(no_slurm)
    if why:
        return {}, why
    with Slurm() as slurm:
        ids = [slurm.sbatch() for _ in range(jobs)]
        return {
            "squeue": timed(["squeue"], slurm.env, repeat),
            "squeue -j ID": timed(["squeue", "-j", ids[-1]], slurm.env, repeat),
            "sinfo": timed(["sinfo"], slurm.env, repeat),
        }, ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs in the store")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs per command")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--no-slurm", action="store_true", help="leave Slurm out")
    args = parser.parse_args()
    results, why = slurm_figures(args.runs, args.repeat, args.no_slurm)

    with tempfile.TemporaryDirectory(prefix="orbit-bench-cli-") as scratch:
        home = Path(scratch) / "home"
        env = {**os.environ, "ORBIT_HOME": str(home), "COLUMNS": "120"}
        env.pop("ORBIT_DATABASE_URL", None)
        # as installed ORBIT runs: from compiled bytecode (pip writes it at install; here the
        # untimed warm-up run does), not compiling every module on every command
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        store = Store(f"sqlite:///{home / 'orbit.db'}")
        fill(store, args.runs - 1)
        store.close()
        spec = Path(scratch) / "spec.yaml"
        spec.write_text(
            "experiment: sft\ntask_type: command\ntemplate: local\ntask: {command: 'sleep 600'}\n",
            encoding="utf-8",
        )
        orbit = [sys.executable, "-m", "orbit"]
        submitted = subprocess.run(
            [*orbit, "submit", str(spec), "--json"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            cwd=scratch,
        )
        live = json.loads(submitted.stdout)["id"]
        try:
            # the installed command, by its name: the completion's variable is named after it
            command = str(Path(sys.executable).parent / "orbit")
            asked = {"_ORBIT_COMPLETE": "complete_bash", "COMP_CWORD": "2"}
            asked["COMP_WORDS"] = "orbit status run-"
            cases = {
                "python3 -c pass": ([sys.executable, "-c", "pass"], {}),
                "orbit --help": ([*orbit, "--help"], {}),
                "orbit runs list": ([*orbit, "runs", "list"], {}),
                "orbit status RUN": ([*orbit, "status", live], {}),
                "orbit queue": ([*orbit, "queue"], {}),
                "orbit nodes list": ([*orbit, "nodes", "list"], {}),
                "complete status RUN": ([command], asked),
            }
            results |= {
                name: timed(argv, {**env, **more}, args.repeat)
                for name, (argv, more) in cases.items()
            }
        finally:
            subprocess.run([*orbit, "cancel", live], env=env, capture_output=True)

    figures = {
        name: {"median_ms": round(statistics.median(t), 1), "max_ms": round(max(t), 1)}
        for name, t in results.items()
    }
    load = round(os.getloadavg()[0], 2)
    if args.json:
        said = {"runs": args.runs, "repeat": args.repeat, "figures": figures, "loadavg": load}
        print(json.dumps(said | ({"slurm_left_out": why} if why else {})))
        return
    print(f"{args.runs} runs in the store (Slurm: as many held jobs); {args.repeat} timed runs")
    print(f"each (ms); load average {load}" + (f"; Slurm left out: {why}" if why else ""))
    print(f"{'command':<22} {'median':>8} {'max':>8}")
    for name, f in figures.items():
        print(f"{name:<22} {f['median_ms']:>8.1f} {f['max_ms']:>8.1f}")


if __name__ == "__main__":
    main()
