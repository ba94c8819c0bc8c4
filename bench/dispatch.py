"""Benchmark: a run's way from submit to its task's start on an `orbit agent`, beside Slurm.

Run from the repository root, as root (Slurm's daemons run as root; without root, or without
slurm-wlm and munge installed, the Slurm figures are left out with a line saying so):

    PYTHONPATH=src .venv/bin/python bench/dispatch.py                 # 500 / 1,000 runs, SQLite
    PYTHONPATH=src .venv/bin/python bench/dispatch.py --quick         # 20 / 40 runs (< 2 min)
    PYTHONPATH=src .venv/bin/python bench/dispatch.py --databases sqlite,postgres --json out.json

For each database (a scratch SQLite file; with --databases ...,postgres also a scratch
PostgreSQL database, created and dropped again) a real `orbit server` (python -m orbit server,
its reconcile loop on) and a real `orbit agent` (python -m orbit agent, joined with a join
token made on the server's store, --max-tasks 16) are started on loopback. Runs use the `pool`
template (a host process on the agent's node) and are submitted with the Python client,
`orbit.Client(url, token).submit(...)`: the HTTP API as a script uses it, without a CLI
process's start-up.

 1. dispatch latency, on an idle agent: --latency runs one after another. Each run's task is
    `date +%s.%N > FILE`; its latency is that stamp minus the time just before the submit call.
    After each run the bench waits until the agent has ended and uploaded it (the server's copy
    holds its result.json) and 50 ms more, so that the next run finds the agent idle. The parts
    of the way are taken from the wrapper's own log: the submit call itself (client, HTTP,
    freeze, store, placement, start command queued), then up to the wrapper's start (the
    agent's long-poll woken, the fencing claim, the bundle fetched once per digest and then
    cached on the node, the attempt staged, the wrapper started), then up to the task's start
    (the NVML audit's first sample, which the wrapper waits for; the precheck, which records
    the task interpreter's packages, runs beside the task when it has nothing to gate, as
    here). p50 and p99 (nearest rank).
 2. end to end: --throughput trivial runs (`date +%s.%N > FILE`) submitted as fast as
    --clients client processes can, onto the one agent (--max-tasks at once; the rest wait as
    prepared until a slot frees, as they would on a real node); runs/s from the first submit
    until the store has every run ended.
 3. cancel: --cancels runs one at a time, each cancelled (`Run.cancel()`) once its task runs;
    from just before the call to the task's TERM trap stamping the time. Goal (the issue):
    within a second.

Slurm, in the same script run: a private, throw-away single-node Slurm on loopback (see
bench/api.py and /work/shared/peers/slurm-bench.sh: SchedulerParameters=batch_sched_delay=0,
sched_min_interval=0, CPUs=32, its own munged). Latency: `sbatch --wrap 'date +%s.%N > FILE'`
one after another, the job's stamp minus the time before sbatch, waiting for each job to leave
the queue and 50 ms more. Throughput: N `sbatch --wrap true` from 16 threads, until the queue is
empty.

The tasks' `python3` is the one on PATH; where that is a pyenv shim (a bash script that costs
a few hundred ms per start) the real interpreter's folder is put first on the agent's PATH, as
a node's system python3 would be found (--keep-path leaves PATH alone).

Goals (the issue): submit -> task started p50 <= 50 ms, p99 <= 250 ms; >= 200 runs/s end to
end. Peer figures measured before on this machine: sbatch -> start p50 661 ms, p99 1.1 s;
32.6 jobs/s end to end. Every figure here comes from this machine in this run; the load
average before and after is printed, as other work on the machine moves the figures.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import psutil

# bench/api.py: the private Slurm, the server process, scratch databases and the figures
from api import (
    SRC,
    Server,
    Slurm,
    add_postgres_url,
    cpu_s,
    database,
    database_kinds,
    machine,
    sayer,
    slurm_missing,
    stop,
    summary,
)

from orbit.core.control.service import CoreControlService
from orbit.model.config import Settings
from orbit.model.models import RunState
from orbit.store import Store
from orbit.store.sql import read_time_required

GOALS = {"p50_ms": 50.0, "p99_ms": 250.0, "runs_per_s": 200.0}
SLURM_THREADS = 16
GAP_S = 0.05  # between latency samples, as slurm-bench.sh leaves
STAMP = "date +%s.%N > {out}/$ORBIT_ATTEMPT_ID"
TERMINAL = {s for s in RunState if s.terminal}


@dataclass
class Sizes:
    latency: int
    throughput: int
    max_tasks: int
    clients: int
    cancels: int


def sizes(args: argparse.Namespace) -> Sizes:
    return Sizes(
        latency=args.latency or (20 if args.quick else 500),
        throughput=args.throughput or (40 if args.quick else 1000),
        max_tasks=args.max_tasks,
        clients=args.clients,
        cancels=args.cancels or (5 if args.quick else 50),
    )


def task_path(keep: bool) -> tuple[str | None, str]:
    """A folder to put first on the agent's PATH (None: leave it), and what the tasks' python3
    is, in words."""
    found = shutil.which("python3") or "python3"
    if keep or "/.pyenv/shims/" not in found:
        return None, found
    real = subprocess.run(["pyenv", "which", "python3"], capture_output=True, text=True)
    if real.returncode != 0 or not real.stdout.strip():
        return None, f"{found} (a pyenv shim)"
    path = real.stdout.strip()
    return str(Path(path).parent), f"{path} (not the pyenv shim {found})"


# -- ORBIT: one server and one agent ------------------------------------------------------------


class Stack:
    """A real `orbit server` and one real `orbit agent` joined to it."""

    def __init__(self, scratch: Path, home: Path, url: str, max_tasks: int, path: str | None):
        self.home, self.url = home, url
        self.server = Server(home, url)
        self.service = CoreControlService.from_settings(
            Settings(home=home, database_url=url), actor="bench"
        )
        self.agent: subprocess.Popen[bytes] | None = None
        try:
            token = self.service.create_join_token({}).token
            self.work = scratch / "agent-work"
            env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
            env["ORBIT_HOME"] = str(scratch / "agent-home")
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            if path:
                env["PATH"] = f"{path}{os.pathsep}{env.get('PATH', '')}"
            argv = [sys.executable, "-m", "orbit", "agent", "--server", self.server.url]
            env["ORBIT_JOIN_TOKEN"] = token  # taken out of the agent's environment at once
            argv += ["--name", "bench", "--work-dir", str(self.work)]
            argv += ["--max-tasks", str(max_tasks), "--task-uids", "none"]
            self.agent_log = scratch / "agent.log"
            with self.agent_log.open("wb") as out:
                self.agent = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 60
            while not any(n.last_seen_at for n in self.service.list_nodes()):
                if self.agent.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the agent did not join: {self.agent_log.read_text()}")
                time.sleep(0.05)
            self.store = Store(url)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.agent is not None:
            stop(self.agent)
        self.server.stop()
        self.service.close()
        if hasattr(self, "store"):
            self.store.close()

    def ended(self) -> int:
        return self.store.runs.count_runs(states=TERMINAL)

    def claimed_at(self, attempt_id: str) -> float:
        """When the server granted the agent's fencing claim (the agent had the start)."""
        with self.store.db.transaction(write=False) as tx:
            value = tx.scalar(
                "SELECT node_claimed_at FROM attempts WHERE id = :a", {"a": attempt_id}
            )
        return read_time_required(value).timestamp()

    def wrapper_times(self, attempt_id: str) -> tuple[float | None, float | None]:
        """When the attempt's wrapper started, and when it started the task (its log)."""
        log = self.work / "attempts" / attempt_id / "runtime" / "runtime.log"
        started = task = None
        for line in log.read_text(errors="replace").splitlines():
            stamp, _, text = line.partition(" ")
            try:
                at = datetime.fromisoformat(stamp).timestamp()
            except ValueError:
                continue
            if started is None:
                started = at
            if text.startswith("starting task"):
                task = at
                break
        return started, task


@contextmanager
def stack(kind: str, scratch: Path, sz: Sizes, path: str | None, admin: str) -> Iterator[Stack]:
    home = scratch / "home"
    with database(kind, home, admin) as url:
        s = Stack(scratch, home, url, sz.max_tasks, path)
        try:
            yield s
        finally:
            s.close()


def spec(out: Path, tag: str) -> dict[str, Any]:
    # `tag` makes a bundle of its own (the command is in it): one per phase, fetched by the
    # agent once and then cached, as a job resubmitted with other runs' settings would be
    command = STAMP.format(out=out) + f"  # {tag}"
    return {"experiment": "bench", "task_type": "command", "template": "pool",
            "task": {"command": command}}  # fmt: skip


def wait_for(check: Callable[[], bool], timeout_s: float, what: str, every: float = 0.002) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(every)


def stamp_of(path: Path) -> float | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    try:
        return float(text)
    except ValueError:  # being written
        return None


def has_stamp(path: Path) -> bool:
    return stamp_of(path) is not None


def orbit_latency(s: Stack, scratch: Path, n: int, path: str | None) -> dict[str, Any]:
    from orbit.client import Client

    out = scratch / "latency-out"
    out.mkdir()
    job = scratch / "job"
    job.mkdir(exist_ok=True)
    client = Client(s.server.url, s.server.token)
    mirror = s.home / "artifacts"
    server_cpu = agent_cpu = 0.0
    server, agent = s.server.process, psutil.Process(s.agent.pid if s.agent else 0)
    rows: list[tuple[float, ...]] = []
    try:
        for i in range(n + 1):  # the first is a warm-up: the bundle reaches the node's cache
            job_spec = spec(out, "latency")
            cpu0 = (cpu_s(server), cpu_s(agent))
            t0 = time.time()
            run = client.submit(job_spec, base_dir=job)
            returned = time.time()
            attempt = run.record.current.id
            wait_for(partial(has_stamp, out / attempt), 120, f"{attempt}'s stamp")
            task = stamp_of(out / attempt)
            assert task is not None
            wait_for(
                (mirror / attempt / "runtime" / "result.json").exists,
                60,
                f"{attempt}'s end uploaded",
                every=0.01,
            )
            if i == 0:
                continue
            server_cpu += cpu_s(server) - cpu0[0]
            agent_cpu += cpu_s(agent) - cpu0[1]
            wrapper, task_started = s.wrapper_times(attempt)
            assert wrapper is not None and task_started is not None, attempt
            claimed = s.claimed_at(attempt)
            rows.append(
                (returned - t0, wrapper - t0, task_started - wrapper, task - t0, claimed - t0,
                 wrapper - claimed)
            )  # fmt: skip
            time.sleep(GAP_S)
    finally:
        client.close()

    def ms(col: int) -> list[float]:
        return [r[col] * 1000 for r in rows]

    alone = precheck_cost(s, scratch, attempt, path)

    return {
        "n": len(rows),
        "task": summary(ms(3)),
        "submit_call": summary(ms(0)),
        "wrapper": summary(ms(1)),
        "precheck": summary(ms(2)),  # the wrapper's start to its "starting task" line
        "claimed": summary(ms(4)),  # the server granted the agent's claim
        "staging": summary(ms(5)),  # the claim to the wrapper's start
        "precheck_alone": alone,
        "server_cpu_ms_each": round(1000 * server_cpu / len(rows), 1),
        "agent_cpu_ms_each": round(1000 * agent_cpu / len(rows), 1),
    }


CANCELLABLE = (
    "trap 'date +%s.%N > {out}/$ORBIT_ATTEMPT_ID.term; exit 0' TERM; "
    "date +%s.%N > {out}/$ORBIT_ATTEMPT_ID; sleep 60 & wait"
)


def orbit_cancel(s: Stack, scratch: Path, n: int) -> dict[str, Any]:
    """Cancel to the task's SIGTERM handler running, on a node: one run at a time, each
    cancelled once its task runs (`Run.cancel()`, which returns once the cancel is recorded
    and sent; the task stamps the time in its TERM trap)."""
    from orbit.client import Client

    out = scratch / "cancel-out"
    out.mkdir()
    job = scratch / "cancel-job"
    job.mkdir()
    client = Client(s.server.url, s.server.token)
    took: list[float] = []
    try:
        for _ in range(n):
            job_spec = {"experiment": "bench", "task_type": "command", "template": "pool",
                        "task": {"command": CANCELLABLE.format(out=out)}}  # fmt: skip
            run = client.submit(job_spec, base_dir=job)
            attempt = run.record.current.id
            wait_for(partial(has_stamp, out / attempt), 120, f"{attempt}'s start", every=0.01)
            time.sleep(0.2)  # running, its log on its way: a cancel of a settled run
            t0 = time.time()
            run.cancel()
            wait_for(partial(has_stamp, out / f"{attempt}.term"), 30, f"{attempt}'s SIGTERM")
            stamp = stamp_of(out / f"{attempt}.term")
            assert stamp is not None
            took.append(1000 * (stamp - t0))
            run.wait(timeout=60, poll=0.05)
            time.sleep(GAP_S)
    finally:
        client.close()
    return summary(took)


def precheck_cost(s: Stack, scratch: Path, attempt: str, path: str | None) -> dict[str, float]:
    """The wrapper's precheck alone, as it ran for `attempt` (on a copy of its folder), three
    times: wall and CPU ms, medians (what it costs the node, beside the task)."""
    copy = scratch / "precheck-copy"
    shutil.copytree(s.work / "attempts" / attempt, copy, symlinks=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    if path:
        env["PATH"] = f"{path}{os.pathsep}{env.get('PATH', '')}"
    argv = ["python3", str(copy / "scripts" / "orbit_precheck.py"), "--bundle", str(copy)]
    walls, cpus = [], []
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, cwd=copy / "inputs" / "workdir", env=env, capture_output=True)
        walls.append(1000 * (time.perf_counter() - start))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(1000 * (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime))
    return {
        "wall_ms": round(statistics.median(walls), 1),
        "cpu_ms": round(statistics.median(cpus), 1),
    }


def submit_worker(url: str, token: str, folder: str, out: str, count: int, barrier: Any,
                  queue: Any) -> None:  # fmt: skip
    """One client process: `count` submissions after the barrier."""
    from orbit.client import Client

    client = Client(url, token)
    try:
        job_spec = spec(Path(out), "throughput")
        barrier.wait()
        cpu = time.process_time()
        for _ in range(count):
            client.submit(job_spec, base_dir=Path(folder))
        queue.put({"done": time.time(), "cpu_s": time.process_time() - cpu})
    except BaseException as exc:
        queue.put({"error": repr(exc)})
        raise
    finally:
        client.close()


def orbit_throughput(s: Stack, scratch: Path, n: int, clients: int) -> dict[str, Any]:
    from orbit.client import Client

    out = scratch / "throughput-out"
    out.mkdir()
    job = scratch / "job"
    job.mkdir(exist_ok=True)
    with Client(s.server.url, s.server.token) as client:  # warm-up: the bundle to the node
        warm = client.submit(spec(out, "throughput"), base_dir=job)
        attempt = warm.record.current.id
        wait_for(partial(has_stamp, out / attempt), 120, "the warm-up run")
    wait_for(lambda: s.ended() >= s.store.runs.count_runs(), 60, "the earlier runs' ends", 0.05)
    before = s.store.runs.count_runs()
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(clients + 1), ctx.Queue()
    each = [n // clients + (1 if i < n % clients else 0) for i in range(clients)]
    workers = [
        ctx.Process(
            target=submit_worker,
            args=(s.server.url, s.server.token, str(job), str(out), k, barrier, queue),
        )
        for k in each
    ]
    for w in workers:
        w.start()
    try:
        barrier.wait(timeout=120)
        t0 = time.time()
        cpu0 = (cpu_s(s.server.process), cpu_s(psutil.Process(s.agent.pid if s.agent else 0)))
        results = [queue.get(timeout=1800) for _ in workers]
        errors = [r["error"] for r in results if "error" in r]
        if errors:
            raise RuntimeError(f"a submitting client failed: {errors[0]}")
        submitted = max(r["done"] for r in results)
        want = before + n
        wait_for(lambda: s.ended() >= want, 1800, "every run's end", every=0.02)
        t_end = time.time()
        server_cpu = cpu_s(s.server.process) - cpu0[0]
        agent_cpu = cpu_s(psutil.Process(s.agent.pid if s.agent else 0)) - cpu0[1]
    finally:
        for w in workers:
            w.join(timeout=30)
            if w.is_alive():
                w.kill()
    stamps = [stamp_of(p) for p in out.iterdir() if p.name != attempt]
    started = [t for t in stamps if t is not None]
    failed = s.store.runs.count_runs(states={RunState.FAILED, RunState.TERMINATED})
    wall = t_end - t0
    return {
        "n": n,
        "clients": clients,
        "per_s": round(n / wall, 1),
        "seconds": round(wall, 1),
        "submit_per_s": round(n / (submitted - t0), 1),
        "all_started_s": round(max(started) - t0, 2) if started else None,
        "started": len(started),
        "not_succeeded": failed,
        "server_cpu_ms_each": round(1000 * server_cpu / n, 1),
        "agent_cpu_ms_each": round(1000 * agent_cpu / n, 1),
        "client_cpu_ms_each": round(1000 * sum(r["cpu_s"] for r in results) / n, 1),
    }


# -- Slurm --------------------------------------------------------------------------------------


def measure_slurm(sz: Sizes, say: Any) -> dict[str, Any]:
    with Slurm() as slurm:
        out = slurm.dir / "out"
        out.mkdir()
        out.chmod(0o777)

        def sbatch(*argv: str) -> str:
            done = subprocess.run(
                ["sbatch", "--parsable", "-o", "/dev/null", "-e", "/dev/null", *argv],
                env=slurm.env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            return done.stdout.strip().split(";")[0]

        def queued(job: str | None = None) -> int:
            argv = ["squeue", "-h"] + (["-j", job] if job else [])
            return len(slurm._out(argv).splitlines())

        def gone(job: str) -> bool:
            return queued(job) == 0

        wrap = f"date +%s.%N > {out}/$SLURM_JOB_ID"
        times: list[float] = []
        for i in range(sz.latency + 1):  # the first is a warm-up (the first scheduling pass)
            t0 = time.time()
            job = sbatch("-J", "lat", "--wrap", wrap)
            wait_for(partial(has_stamp, out / job), 120, f"job {job}'s stamp")
            task = stamp_of(out / job)
            assert task is not None
            wait_for(partial(gone, job), 60, f"job {job} to leave the queue", 0.01)
            if i:
                times.append((task - t0) * 1000)
            time.sleep(GAP_S)
        latency = summary(times)
        say(f"slurm latency {latency}")

        assert slurm.ctld is not None
        ctld = psutil.Process(slurm.ctld.pid)
        cpu0 = cpu_s(ctld)
        t0 = time.time()
        with ThreadPoolExecutor(SLURM_THREADS) as pool:
            ids = list(
                pool.map(lambda _: sbatch("-J", "tp", "--wrap", "true"), range(sz.throughput))
            )
        submitted = time.time()
        wait_for(lambda: queued() == 0, 1800, "the queue to drain", every=0.05)
        wall = time.time() - t0
        throughput = {
            "n": len(ids),
            "clients": SLURM_THREADS,
            "per_s": round(len(ids) / wall, 1),
            "seconds": round(wall, 1),
            "submit_per_s": round(len(ids) / (submitted - t0), 1),
            "slurmctld_cpu_ms_each": round(1000 * (cpu_s(ctld) - cpu0) / len(ids), 1),
        }  # fmt: skip
        say(f"slurm throughput {throughput}")
        return {"version": slurm.version, "latency": latency, "throughput": throughput}


# -- the report ---------------------------------------------------------------------------------


def table(dbs: dict[str, dict[str, Any]], slurm: dict[str, Any] | None, sz: Sizes) -> list[str]:
    kinds = list(dbs)
    s = slurm or {}
    first = dbs[kinds[0]]

    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        return f"{v:,.1f}" if isinstance(v, float) else f"{v:,}"

    def row(metric: str, key: Any, peer: float | None = None, goal: str = "",
            better: str = "low", limit: float | None = None) -> str:  # fmt: skip
        values = [key(dbs[k]) for k in kinds]
        ratio = f"{values[0] / peer:.2f}" if peer and values[0] is not None else "-"
        met = ""
        if limit is not None:
            ok = [(v <= limit) if better == "low" else (v >= limit) for v in values]
            met = " / ".join("yes" if x else "NO" for x in ok)
        cells = [metric, *(fmt(v) for v in values), fmt(peer), ratio, goal, met]
        return "| " + " | ".join(cells) + " |"

    lat, tp = s.get("latency", {}), s.get("throughput", {})
    head = ["metric", *(f"ORBIT {k}" for k in kinds), "Slurm", f"ratio ({kinds[0]}/Slurm)",
            "goal", "met?"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += [
        row(f"submit -> task started, p50 ms ({first['latency']['n']} runs)",
            lambda d: d["latency"]["task"]["p50_ms"], lat.get("p50_ms"), "<= 50", "low", 50.0),
        row("submit -> task started, p99 ms", lambda d: d["latency"]["task"]["p99_ms"],
            lat.get("p99_ms"), "<= 250", "low", 250.0),
        row("  submit call returns (Client.submit), p50 ms",
            lambda d: d["latency"]["submit_call"]["p50_ms"]),
        row("  submit -> the agent's claim granted, p50 ms",
            lambda d: d["latency"]["claimed"]["p50_ms"]),
        row("  claim -> wrapper started (bundle, staging, wrapper), p50 ms",
            lambda d: d["latency"]["staging"]["p50_ms"]),
        row("  submit -> wrapper started on the node, p50 ms",
            lambda d: d["latency"]["wrapper"]["p50_ms"]),
        row("  submit -> wrapper started on the node, p99 ms",
            lambda d: d["latency"]["wrapper"]["p99_ms"]),
        row("  wrapper -> task (the NVML audit's first sample), p50 ms",
            lambda d: d["latency"]["precheck"]["p50_ms"]),
        row("  the precheck alone (beside the task), wall ms",
            lambda d: d["latency"]["precheck_alone"]["wall_ms"]),
        row("  the precheck alone: CPU ms",
            lambda d: d["latency"]["precheck_alone"]["cpu_ms"]),
        row("  server CPU ms per run", lambda d: d["latency"]["server_cpu_ms_each"]),
        row("  agent CPU ms per run", lambda d: d["latency"]["agent_cpu_ms_each"]),
        row(f"end to end runs/s ({first['throughput']['n']} trivial runs, "
            f"max_tasks {sz.max_tasks})", lambda d: d["throughput"]["per_s"], tp.get("per_s"),
            ">= 200", "high", 200.0),
        row(f"  submissions/s ({sz.clients} client processes; Slurm 16 threads)",
            lambda d: d["throughput"]["submit_per_s"], tp.get("submit_per_s")),
        row("  seconds until every run ended", lambda d: d["throughput"]["seconds"],
            tp.get("seconds")),
        row("  server CPU ms per run", lambda d: d["throughput"]["server_cpu_ms_each"],
            tp.get("slurmctld_cpu_ms_each")),
        row("  agent CPU ms per run", lambda d: d["throughput"]["agent_cpu_ms_each"]),
        row("  client CPU ms per submission", lambda d: d["throughput"]["client_cpu_ms_each"]),
        row(f"cancel -> the task's SIGTERM, p50 ms ({first['cancel']['n']} runs)",
            lambda d: d["cancel"]["p50_ms"], None, "<= 1000", "low", 1000.0),
        row("cancel -> the task's SIGTERM, p99 ms", lambda d: d["cancel"]["p99_ms"], None,
            "<= 1000", "low", 1000.0),
    ]  # fmt: skip
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true",
                        help="20 latency runs, 40 end to end, 5 cancels")  # fmt: skip
    parser.add_argument("--cancels", type=int, default=None, help="runs cancelled (50)")
    parser.add_argument("--latency", type=int, default=None, help="latency runs (500)")
    parser.add_argument("--throughput", type=int, default=None, help="end-to-end runs (1,000)")
    parser.add_argument("--max-tasks", type=int, default=16, help="the agent's --max-tasks (16)")
    parser.add_argument("--clients", type=int, default=4, help="submitting processes (4)")
    parser.add_argument("--databases", default="sqlite", help="sqlite, postgres or both (sqlite)")
    parser.add_argument("--no-slurm", action="store_true", help="leave Slurm out")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folders (logs)")
    parser.add_argument("--keep-path", action="store_true", help="leave the agent's PATH alone")
    add_postgres_url(parser)
    parser.add_argument("--json", metavar="FILE", help="write the figures as JSON to FILE")
    args = parser.parse_args()
    kinds = database_kinds(parser, args.databases)
    sz = sizes(args)
    began = time.monotonic()
    say = sayer(began)

    path, python = task_path(args.keep_path)
    result: dict[str, Any] = {"sizes": sz.__dict__, "machine_before": machine(),
                              "task_python": python, "databases": {}}  # fmt: skip
    slurm: dict[str, Any] | None = None
    why = slurm_missing(args.no_slurm)
    if why:
        say(f"Slurm left out: {why}")
    else:
        slurm = measure_slurm(sz, say)
    result["slurm"] = slurm or {"skipped": why}

    for kind in kinds:
        scratch = Path(tempfile.mkdtemp(prefix=f"orbit-bench-dispatch-{kind}-"))
        try:
            report: dict[str, Any] = {"loadavg_before": round(os.getloadavg()[0], 2)}
            with stack(kind, scratch, sz, path, args.postgres_url) as s:
                say(f"{kind}: server and agent up")
                report["latency"] = orbit_latency(s, scratch, sz.latency, path)
                say(f"{kind}: latency {report['latency']}")
                report["throughput"] = orbit_throughput(s, scratch, sz.throughput, sz.clients)
                say(f"{kind}: throughput {report['throughput']}")
                report["cancel"] = orbit_cancel(s, scratch, sz.cancels)
                say(f"{kind}: cancel {report['cancel']}")
            report["loadavg_after"] = round(os.getloadavg()[0], 2)
            result["databases"][kind] = report
        finally:
            if args.keep:
                say(f"{kind}: kept {scratch}")
            else:
                shutil.rmtree(scratch, ignore_errors=True)
    result["machine_after"] = machine()
    result["seconds"] = round(time.monotonic() - began, 1)

    m0, m1 = result["machine_before"], result["machine_after"]
    print(
        f"\n{m0['cpus']} CPUs ({m0['cpu']}), Python {m0['python']}, "
        f"Slurm {slurm['version'] if slurm else '- (' + why + ')'}; load average "
        f"{m0['loadavg'][0]} before, {m1['loadavg'][0]} after; {result['seconds']:.0f} s in all. "
        f"ORBIT submits with the Python client (orbit.Client over HTTP); tasks' python3: {python}\n"
    )
    for line in table(result["databases"], slurm, sz):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
