"""Benchmark: what ORBIT adds to a bare `sbatch` on the same private single-node Slurm, same run.

Run from the repository root, as root (Slurm's daemons run as root):

    PYTHONPATH=src .venv/bin/python bench/slurm.py                 # 30 samples, 200 runs
    PYTHONPATH=src .venv/bin/python bench/slurm.py --quick --json out.json

One private Slurm (bench/api.py's: slurmctld + slurmd on loopback, a munged of its own, 32 CPUs
advertised; SchedulerParameters=batch_sched_delay=0,sched_min_interval=0, as
/work/shared/peers/slurm-bench.sh --tuned) serves both sides. ORBIT is the control plane in this
process (orbit.Client.local: embedded, SQLite in a scratch ORBIT home), the cluster registered
with --local (this machine is its submit host), runs submitted with template slurm. The task is
the same one line on both sides, `date +%s.%N > OUT/$SLURM_JOB_ID`: bare, as an sbatch script of
its own; through ORBIT, as a `command` task (1 CPU, no memory asked, as the bare job), which
runs inside ORBIT's wrapper (runtime/, precheck, NVML audit, manifest) in its job.

    submit        the call's time: `sbatch --parsable SCRIPT` (a process, as a user runs it)
                  against Client.submit (validate, freeze the bundle, stage it by digest,
                  write scripts/slurm.sbatch, sbatch), median of --samples
    submit, CLI   the same through a process each side: `sbatch` against `orbit submit
                  SPEC` (a Python start and ORBIT's imports; .pyc files as this checkout has
                  them), median of --cli-samples
    to start      from before the submit call to the task's own time stamp, median; one job
                  at a time, each waited out (bare: gone from the queue; ORBIT: the run
                  succeeded in its store) before the next. Slurm 22.05 here starts batch jobs
                  on a one-second timer, so a job waits for the next tick whenever it is
                  submitted: a side submitted at a fixed point after the other's end would
                  be favoured or penalised by where that point falls (the first figures,
                  bare always just before a tick, ORBIT just after one). So each pair of
                  samples is submitted at the same random phase of that tick (found from the
                  bare jobs' stamps), and ORBIT's added time is the median difference within
                  the pairs (its own time in the job: both caught the same tick) plus the
                  difference of the submit calls (on a timer, what a later sbatch adds to
                  the wait on average, whatever the tick)
    throughput    --runs trivial runs submitted one after another by one client, until all
                  have ended: bare, the queue empty; ORBIT, every run succeeded in its store
                  (the queue empty, then one look at each run, as `orbit runs list` makes)

Goal (issue 13): ORBIT adds <= 10% to end-to-end throughput and <= 100 ms to submit-to-start,
with everything its wrapper does (the default). --no-precheck measures what the precheck costs
(it runs beside a task with nothing to gate, in the task's interpreter: a Python start of its
own per run).
Every figure comes from this machine in this run; the load average is printed with each line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# bench/api.py: the private Slurm and the progress lines
from api import Slurm, sayer, slurm_missing

from orbit.client import Client
from orbit.model.clusters import ClusterSpec


def wait_for(
    what: str, ok: Callable[[], bool], timeout_s: float = 120, every: float = 0.01
) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen in {timeout_s:.0f}s")
        time.sleep(every)


def stamp(path: Path) -> float | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return float(text) if text.endswith("\n") else None  # written whole


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1)


class Bench:
    def __init__(self, slurm: Slurm, scratch: Path) -> None:
        self.slurm = slurm
        self.out = scratch / "out"
        self.out.mkdir()
        self.out.chmod(0o777)
        command = f"date +%s.%N > {self.out}/$SLURM_JOB_ID"
        self.script = scratch / "bare.sbatch"
        self.script.write_text(f"#!/bin/bash\n#SBATCH --job-name=bare\n{command}\n")
        self.client = Client.local(scratch / "orbit-home")
        self.client.api.add_cluster(
            ClusterSpec(
                name="bench",
                local=True,
                slurm_conf=slurm.env["SLURM_CONF"],
                work_dir=str(scratch / "cluster-work"),
            )
        )
        self.spec = {
            "experiment": "bench-slurm",
            "task_type": "command",
            "template": "slurm",
            "task": {"command": command},
            "overrides": {"target": "bench", "resources": {"cpu_count": 1, "memory_gb": 0}},
        }

        self.scratch = scratch
        self.tick = 0.0  # the fraction of a second at which Slurm's timer starts batch jobs

    def at_phase(self, phase: float) -> None:
        """Sleep until `phase` (0..1) of a second past Slurm's tick."""
        time.sleep((self.tick + phase - time.time()) % 1.0)

    def cli_env(self) -> dict[str, str]:
        home = self.scratch / "orbit-home"
        return {
            **self.slurm.env,
            "ORBIT_HOME": str(home),
            "ORBIT_DATABASE_URL": f"sqlite:///{home / 'orbit.db'}",
        }

    def cli_sample(self, spec: Path) -> tuple[float, float]:
        """One `sbatch` and one `orbit submit` process, each timed, each job waited out."""
        t0 = time.time()
        job = self.sbatch()
        bare = time.time() - t0
        wait_for(f"job {job} to leave the queue", lambda: self.queued(job) == 0)
        orbit = [str(Path(sys.executable).with_name("orbit")), "submit", str(spec), "--json"]
        t0 = time.time()
        done = subprocess.run(orbit, env=self.cli_env(), capture_output=True, text=True)
        cli = time.time() - t0
        assert done.returncode == 0, done.stderr
        run_id = json.loads(done.stdout)["id"]
        self.client.run(run_id).wait(timeout=120, poll=0.05)
        return bare, cli

    def queued(self, job: str | None = None) -> int:
        argv = ["squeue", "-h"] + (["-j", job] if job else [])
        done = subprocess.run(argv, env=self.slurm.env, capture_output=True, text=True)
        return len(done.stdout.splitlines())

    def sbatch(self) -> str:
        done = subprocess.run(
            ["sbatch", "--parsable", "-o", "/dev/null", str(self.script)],
            env=self.slurm.env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return done.stdout.strip().split(";")[0]

    def submit(self) -> tuple[str, str]:
        run = self.client.submit(self.spec)
        attempt = run.attempts[-1]
        assert attempt.handle is not None, attempt
        return run.id, str(attempt.handle.data["job_id"])

    def bare_sample(self) -> tuple[float, float]:
        t0 = time.time()
        job = self.sbatch()
        submitted = time.time() - t0
        wait_for(f"job {job}'s stamp", lambda: stamp(self.out / job) is not None)
        started = (stamp(self.out / job) or 0) - t0
        self.tick = (stamp(self.out / job) or 0) % 1.0
        wait_for(f"job {job} to leave the queue", lambda: self.queued(job) == 0)
        return submitted, started

    def orbit_sample(self) -> tuple[float, float]:
        t0 = time.time()
        run_id, job = self.submit()
        submitted = time.time() - t0
        wait_for(f"job {job}'s stamp", lambda: stamp(self.out / job) is not None)
        started = (stamp(self.out / job) or 0) - t0
        ended = self.client.run(run_id).wait(timeout=120, poll=0.05)
        assert ended.state.value == "succeeded", ended
        return submitted, started

    def throughput(self, n: int, orbit: bool) -> dict[str, Any]:
        t0 = time.time()
        runs = [self.submit()[0] if orbit else self.sbatch() for _ in range(n)]
        submitted = time.time() - t0
        wait_for("the queue to drain", lambda: self.queued() == 0, 1800, every=0.05)
        if orbit:
            states = [self.client.api.refresh_run_status(r).current.state.value for r in runs]
            assert states == ["succeeded"] * n, sorted(set(states))
        wall = time.time() - t0
        return {
            "n": n,
            "per_s": round(n / wall, 2),
            "seconds": round(wall, 1),
            "submit_per_s": round(n / submitted, 1),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=30, help="latency samples per side")
    parser.add_argument("--runs", type=int, default=200, help="runs per side for throughput")
    parser.add_argument("--cli-samples", type=int, default=8, help="`orbit submit` processes")
    parser.add_argument("--quick", action="store_true", help="10 samples, 50 runs, 4 CLI")
    parser.add_argument(
        "--no-precheck",
        action="store_true",
        help="what the precheck costs: bundles frozen without scripts/orbit_precheck.py (the "
        "wrapper then runs none); a measure, not an option users have",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.runs, args.cli_samples = 10, 50, 4
    if args.no_precheck:
        from orbit.core.execution import bundle

        bundle.WRAPPER_FILES.pop("precheck.py")
    missing = slurm_missing(False)
    if missing:
        print(f"bench/slurm.py needs a private Slurm: {missing}", file=sys.stderr)
        return 2
    say = sayer(time.monotonic())
    with tempfile.TemporaryDirectory(prefix="orbit-bench-slurm-") as tmp, Slurm() as slurm:
        bench = Bench(slurm, Path(tmp))
        say(f"Slurm {slurm.version}; warming up")
        bench.bare_sample()
        bench.orbit_sample()  # the first bundle is frozen and staged here
        sub: dict[str, list[float]] = {"bare": [], "orbit": []}
        start: dict[str, list[float]] = {"bare": [], "orbit": []}
        for i in range(args.samples):
            phase = random.random()  # the same point of Slurm's tick for both of the pair
            for side, sample in (("bare", bench.bare_sample), ("orbit", bench.orbit_sample)):
                bench.at_phase(phase)
                s, t = sample()
                sub[side].append(s)
                start[side].append(t)
            if (i + 1) % 10 == 0:
                say(f"{i + 1} samples a side")
        latency: dict[str, Any] = {
            side: {"submit_ms": median_ms(sub[side]), "to_start_ms": median_ms(start[side])}
            for side in sub
        }
        pairs = [o - b for o, b in zip(start["orbit"], start["bare"], strict=True)]
        latency["in_job_added_ms"] = median_ms(pairs)  # same tick: ORBIT's time in the job
        say(f"latency {latency}")
        spec = Path(tempfile.mkdtemp(dir=tmp)) / "spec.json"
        spec.write_text(json.dumps(bench.spec))
        cli = [bench.cli_sample(spec) for _ in range(args.cli_samples)]
        latency["cli"] = {
            "bare_ms": median_ms([b for b, _ in cli]),
            "orbit_ms": median_ms([o for _, o in cli]),
        }
        say(f"submit through a process each {latency['cli']}")
        bare = bench.throughput(args.runs, orbit=False)
        say(f"bare throughput {bare}")
        orbit = bench.throughput(args.runs, orbit=True)
        say(f"orbit throughput {orbit}")
        bench.client.close()
    submit_added = latency["orbit"]["submit_ms"] - latency["bare"]["submit_ms"]
    added_ms = round(latency["in_job_added_ms"] + submit_added, 1)
    report = {
        "slurm": slurm.version,
        "samples": args.samples,
        "latency": latency,
        "submit_ratio": round(latency["orbit"]["submit_ms"] / latency["bare"]["submit_ms"], 2),
        "to_start_added_ms": added_ms,
        "to_start_ratio": round(
            latency["orbit"]["to_start_ms"] / latency["bare"]["to_start_ms"], 2
        ),
        "throughput": {"bare": bare, "orbit": orbit},
        "throughput_ratio": round(orbit["per_s"] / bare["per_s"], 2),
        "load": os.getloadavg()[0],
        "precheck": not args.no_precheck,
        "goals": {
            "to_start_added_ms<=100": added_ms <= 100,
            "throughput_loss<=10%": orbit["per_s"] >= 0.9 * bare["per_s"],
        },
    }
    lat = report["latency"]
    print(f"{'median, Slurm ' + slurm.version:<28}{'bare sbatch':>14}{'ORBIT':>14}{'ratio':>8}")
    print(
        f"{'submit call (ms)':<28}{lat['bare']['submit_ms']:>14}{lat['orbit']['submit_ms']:>14}"
        f"{report['submit_ratio']:>8}"
    )
    print(
        f"{'submit to start (ms)':<28}{lat['bare']['to_start_ms']:>14}"
        f"{lat['orbit']['to_start_ms']:>14}{report['to_start_ratio']:>8}"
    )
    print(
        f"{f'{args.runs} runs end to end (/s)':<28}{bare['per_s']:>14}{orbit['per_s']:>14}"
        f"{report['throughput_ratio']:>8}"
    )
    print(
        f"{'submit call, CLI (ms)':<28}{lat['cli']['bare_ms']:>14}{lat['cli']['orbit_ms']:>14}"
        f"{round(lat['cli']['orbit_ms'] / lat['cli']['bare_ms'], 2):>8}"
    )
    print(
        f"ORBIT adds {added_ms} ms to submit-to-start ({lat['in_job_added_ms']} in the job, "
        f"{round(submit_added, 1)} in the submit call); goals: {report['goals']}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
