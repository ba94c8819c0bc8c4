"""Benchmark: `orbit server` with 100,000 runs in its store, beside Slurm on the same machine.

Run from the repository root, as root (Slurm's daemons run as root; without root, or without
slurm-wlm and munge installed, the Slurm figures are left out with a line saying so):

    PYTHONPATH=src .venv/bin/python bench/api.py                   # 100,000 runs, SQLite + PG
    PYTHONPATH=src .venv/bin/python bench/api.py --quick           # 5,000 runs, fewer samples
    PYTHONPATH=src .venv/bin/python bench/api.py --databases sqlite --no-slurm --json out.json

Slurm first: a private single-node cluster on loopback, built as
/work/shared/peers/slurm-bench.sh builds it (its own slurm.conf, slurmctld and slurmd started by
hand on free ports), here with a munged of its own on its own socket, so that nothing of the
machine's is touched; exactly those daemons are stopped at the end. Measured there:

    sbatch/s      `sbatch --hold --wrap true` from 16 threads at once (--hold: the job stays
                  queued, as ORBIT's submissions below stay prepared)
    squeue -j ID  the process time of `squeue -j ID` (one queued job), median
    squeue        the process time of `squeue`, listing every queued job (the sbatch jobs)

The runs to seed are planned once (the rows and audit events that create_run and the state
moves write, hash chain included, as if submitted, launched on this machine and ended over the
last 90 days: five experiments, 78% succeeded, 12% failed, 4% cancelled, 6% retried once after
an infrastructure failure). Then, for each database (a scratch SQLite file; a scratch
PostgreSQL database, created and dropped again), a real `orbit server` process (python -m orbit
server) is started and stopped a few times:

 1. on an empty store: GET /api/v1/runs?limit=50, p50 and p99; then again once the store
    holds one page (50 runs, made with the store's own calls): what a page costs
 2. on a new store, seeded with --runs runs in one batch of inserts (PostgreSQL then
    VACUUM ANALYZEd, as autovacuum would leave it), the server as deployed (reconcile loop
    on): GET /api/v1/runs/{id} of random runs and GET /api/v1/runs?limit=50 from one httpx
    client, one request at a time on one connection, p50 and p99, and the server's CPU per
    request; `orbit runs show ID`, `orbit runs list --limit 50` and `orbit --version` as new
    processes (the CLI over HTTP, from compiled bytecode as an installed ORBIT runs), median;
    then, with nothing left to do, the server's CPU (% of one core) over --idle-s seconds
    and its RSS
 3. 100 prepared runs added (store.runs.create_run, unclaimed) and the server restarted with
    ORBIT_FAILPOINTS=launch=skip: its loop looks at the 100 again and again, launching none;
    CPU and RSS over --idle-s seconds again, and the looks per second
 4. the server with --no-loops and ORBIT_FAILPOINTS=launch=skip (every new attempt is left
    prepared: the path of a submission up to the store, see orbit/model/failpoints.py): a tiny
    `command` task on the `local` template submitted with RemoteControl.submit_task from 16
    client processes at once (processes, not threads: a client's shaping, tar.gz and
    multipart take CPU of their own, and one interpreter's GIL would hold 16 threads to one
    core); submissions/s over the whole batch, and the server's and the clients' CPU per
    submission (on a machine with few cores the clients take CPU the server would use)

 5. on the same server, one sweep (`orbit submit --sweep i=1..N`, N = --sweep-points, 10,000;
    --quick 1,000) through RemoteControl.submit_sweep: the time until its group answers (every
    run written and queued), runs/s, and the server's CPU per run

Goals (the issue): show p99 <= 20 ms; list p99 <= 50 ms at 100k runs and no more than 2x the
empty store's; >= 1,000 queued submissions/s; a 10,000-point sweep queued in <= 2 s; idle < 1%
of a core and < 150 MB RSS. Every figure comes from this machine in this run; the load average
before and after is printed, as other work on the machine moves the figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import platform
import random
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psutil

from orbit.model.audit_chain import canonical_data, event_hash
from orbit.model.models import ExecutionRequest, RunState, TaskSubmission
from orbit.model.records import RunRecord
from orbit.store import Store
from orbit.store.audit import AUDIT_LOCK_KEY

SRC = Path(__file__).resolve().parents[1] / "src"
ORBIT = [sys.executable, "-m", "orbit"]
CLIENTS = 16
PAGE = 50  # runs a list asks for
ACTIVE_RUNS = 100
EXPERIMENTS = ("sft", "grpo", "dpo", "eval", "pretrain")
USERS = ("alice", "bob", "carol", "dmitri", "admin")
SPEC = "experiment: bench\ntask_type: command\ntemplate: local\ntask: {command: 'true'}\n"
GOALS = {"show_p99_ms": 20.0, "list_p99_ms": 50.0, "list_vs_empty": 2.0, "submit_per_s": 1000.0}
GOAL_IDLE_CPU = 1.0  # % of one core
GOAL_IDLE_RSS = 150.0  # MB


@dataclass
class Sizes:
    runs: int
    show: int  # GET /runs/{id} samples
    lists: int  # GET /runs?limit=50 samples
    cli: int  # CLI processes per command
    submissions: int  # in all, over the 16 clients
    idle_s: float
    sweep: int = 10_000  # points of the one sweep submitted


def sizes(args: argparse.Namespace) -> Sizes:
    if args.quick:
        return Sizes(
            runs=args.runs or 5000, show=300, lists=60, cli=3, submissions=96, idle_s=3, sweep=1000
        )
    return Sizes(
        runs=args.runs or 100_000,
        show=2000,
        lists=400,
        cli=10,
        submissions=800,
        idle_s=args.idle_s,
    )


# -- figures ------------------------------------------------------------------------------------


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


def summary(ms: list[float]) -> dict[str, float]:
    return {
        "n": len(ms),
        "p50_ms": round(pct(ms, 50), 2),
        "p99_ms": round(pct(ms, 99), 2),
        "max_ms": round(max(ms), 2),
    }


def timed_processes(argv: list[str], env: dict[str, str], repeat: int) -> dict[str, float]:
    """Wall time of `argv` as a new process, `repeat` times after one untimed warm-up run."""
    subprocess.run(argv, env=env, check=True, capture_output=True)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True)
        times.append((time.perf_counter() - start) * 1000)
    return {
        "n": repeat,
        "median_ms": round(statistics.median(times), 1),
        "max_ms": round(max(times), 1),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, wait_s: float = 15) -> None:
    """Stop one process this script started: `sig`, then SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def idle(process: psutil.Process, seconds: float) -> dict[str, float]:
    """% of one core used over `seconds` (all threads), and the RSS at the end."""
    before, start = cpu_s(process), time.monotonic()
    time.sleep(seconds)
    used, wall = cpu_s(process) - before, time.monotonic() - start
    return {
        "seconds": round(wall, 1),
        "cpu_pct": round(100 * used / wall, 2),
        "rss_mb": round(process.memory_info().rss / 1e6, 1),
    }


# -- Slurm --------------------------------------------------------------------------------------


class Slurm:
    """A private, throw-away single-node Slurm (slurmctld + slurmd on loopback, its own munged
    on its own socket and key), as /work/shared/peers/slurm-bench.sh builds one."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="orbit-bench-slurm-"))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.dir / "slurm.conf")}
        self.ctld: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Slurm:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _daemon(self, argv: list[str], name: str) -> subprocess.Popen[bytes]:
        out = (self.dir / "log" / f"{name}.out").open("wb")
        proc = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def _wait(self, what: str, ok: Callable[[], bool], timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while not ok():
            if time.monotonic() > deadline:
                raise RuntimeError(f"slurm: {what} did not happen; see {self.dir}/log")
            time.sleep(0.1)

    def _start(self) -> None:
        d = self.dir
        d.chmod(0o711)
        for sub in ("state", "spool", "log", "munge"):
            (d / sub).mkdir()
        (d / "munge").chmod(0o711)  # the socket must be reachable; munged checks the folder
        key = d / "munge" / "key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = d / "munge" / "sock"
        self._daemon(
            [
                "munged", "-F", "-f", f"--socket={sock}", f"--key-file={key}",
                f"--pid-file={d / 'munge' / 'pid'}", f"--log-file={d / 'log' / 'munged.log'}",
                f"--seed-file={d / 'munge' / 'seed'}",
            ],
            "munged",
        )  # fmt: skip
        self._wait("munged's socket", sock.exists)
        ctld_port, slurmd_port = free_port(), free_port()
        conf = f"""\
ClusterName=orbitbench
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
SlurmctldDebug=error
SlurmdDebug=error
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=100
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
MaxJobCount=200000
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmdParameters=config_overrides
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
NodeName=localhost NodeAddr=127.0.0.1 CPUs=32 RealMemory=20000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""
        Path(self.env["SLURM_CONF"]).write_text(conf, encoding="utf-8")
        self.ctld = self._daemon(["slurmctld", "-D", "-f", self.env["SLURM_CONF"]], "slurmctld")
        self._wait("scontrol ping UP", lambda: "UP" in self._out(["scontrol", "ping"]))
        self._daemon(["slurmd", "-D", "-N", "localhost", "-f", self.env["SLURM_CONF"]], "slurmd")
        node = ["sinfo", "-h", "-n", "localhost", "-o", "%T"]
        self._wait("the node idle", lambda: self._out(node).strip() == "idle")
        self.version = self._out(["sbatch", "--version"]).split()[-1]

    def _out(self, argv: list[str]) -> str:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True)
        return done.stdout

    def sbatch(self) -> str:
        done = subprocess.run(
            ["sbatch", "--parsable", "--hold", "-J", "bench", "-o", "/dev/null", "--wrap", "true"],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.strip().split(";")[0]

    def close(self) -> None:
        if self.ctld is not None and self.ctld.poll() is None:
            # a private cluster: only this script's jobs are in it
            subprocess.run(["scancel", "--quiet", "--user=root"], env=self.env, check=False)
        for proc in reversed(self.procs):  # slurmd, slurmctld, then munged
            stop(proc, wait_s=10)
        shutil.rmtree(self.dir, ignore_errors=True)


def measure_slurm(sz: Sizes) -> dict[str, Any]:
    with Slurm() as slurm:
        slurm.sbatch()  # warm-up, untimed
        assert slurm.ctld is not None
        ctld = psutil.Process(slurm.ctld.pid)
        cpu0, start = cpu_s(ctld), time.monotonic()
        with ThreadPoolExecutor(CLIENTS) as pool:
            ids = list(pool.map(lambda _: slurm.sbatch(), range(sz.submissions)))
        wall = time.monotonic() - start
        ctld_cpu = cpu_s(ctld) - cpu0
        queued = len(slurm._out(["squeue", "-h"]).splitlines())
        return {
            "version": slurm.version,
            "sbatch": {
                "n": len(ids),
                "clients": CLIENTS,
                "per_s": round(len(ids) / wall, 1),
                "slurmctld_cpu_ms_each": round(1000 * ctld_cpu / len(ids), 2),
            },
            "queued": queued,
            "squeue_j": timed_processes(["squeue", "-j", ids[len(ids) // 2]], slurm.env, sz.cli),
            "squeue": timed_processes(["squeue"], slurm.env, sz.cli),
        }


# -- the store: seeding -------------------------------------------------------------------------

RUN_COLS = (
    "id, experiment_id, task_type, template_id, bundle_digest, submission, request, "
    "created_at, created_by, replay_of, state"
)
ATTEMPT_COLS = (
    'id, run_id, number, state, reason, target, backend_key, "trigger", handle, exit_code, '
    "message, cancel_requested, created_at, updated_at, started_at, finished_at, "
    "last_contact_at, unreachable_since, lease_owner, lease_expires_at, not_before"
)
EVENT_COLS = "at, actor, action, run_id, attempt_id, data, prev_hash, hash"
WORK_ROOT = "/var/lib/orbit/work"  # where the seeded attempts ran (their handles' location)


@dataclass
class Seed:
    experiments: list[tuple[Any, ...]] = field(default_factory=list)
    runs: list[tuple[Any, ...]] = field(default_factory=list)
    attempts: list[tuple[Any, ...]] = field(default_factory=list)
    # (at, actor, action, run_id, attempt_id, data): chained (see chain) once sorted by time
    events: list[tuple[datetime, str, str, str | None, str | None, dict[str, Any]]] = field(
        default_factory=list
    )
    run_ids: list[str] = field(default_factory=list)
    # the rows of the events table, a hash chain from the first event: the same for each
    # database (the seed goes into a new store, before anything else is written to it)
    chained: list[tuple[Any, ...]] = field(default_factory=list)

    def chain(self) -> None:
        prev = None
        for at, actor, action, run_id, attempt_id, data in sorted(self.events, key=lambda e: e[0]):
            content = canonical_data(data)
            digest = event_hash(
                prev_hash=prev, at=at, actor=actor, action=action, run_id=run_id,
                attempt_id=attempt_id, data=content,
            )  # fmt: skip
            self.chained.append((at, actor, action, run_id, attempt_id, content, prev, digest))
            prev = digest
        self.events = []


def plan_seed(runs: int, rng: random.Random) -> Seed:
    """The rows ORBIT itself would have written for `runs` runs that were submitted, launched
    on this machine and ended over the last 90 days."""
    seed = Seed()
    now = datetime.now(UTC)
    first = now - timedelta(days=90)
    step = (timedelta(days=90) - timedelta(hours=3)) / max(runs, 1)
    experiments = []
    for i, name in enumerate(EXPERIMENTS):
        exp_id, at = (
            f"exp-{rng.getrandbits(40):010x}",
            first - timedelta(hours=len(EXPERIMENTS) - i),
        )
        experiments.append(exp_id)
        seed.experiments.append((exp_id, name, at))
        seed.events.append(
            (at, "admin", "experiment.created", None, None, {"experiment_id": exp_id, "name": name})
        )
    digests = [f"{rng.getrandbits(256):064x}" for _ in range(max(runs // 8, 1))]
    seen: set[str] = set()
    for i in range(runs):
        run_id = f"run-{rng.getrandbits(40):010x}"
        while run_id in seen:
            run_id = f"run-{rng.getrandbits(40):010x}"
        seen.add(run_id)
        seed.run_ids.append(run_id)
        exp_id = experiments[rng.randrange(len(experiments))]
        user = USERS[rng.randrange(len(USERS))]
        digest = digests[rng.randrange(len(digests))]
        created = first + step * i + timedelta(seconds=rng.random() * 30)
        command = f"python train.py --lr {rng.choice((1e-4, 3e-4, 1e-3))} --seed {i}"
        submission = {
            "experiment_id": exp_id,
            "task_type": "command",
            "task_request": {"command": command},
            "template_id": "local",
            "overrides": {
                "target": None, "detach": None, "resources": None, "runtime_env": None,
                "stop_grace_s": None, "image": None,
            },
            "retry": {"max_retries": 2, "on_exit_codes": [], "backoff_s": 10.0,
                      "backoff_max_s": 600.0},
            "allow_dirty": False,
        }  # fmt: skip
        request = {
            "template_id": "local",
            "placement": {"kind": "local"},
            "launch_mode": {"kind": "host_process"},
            "target": "localhost",
            "detach": True,
            "resources": {"gpu_type": None, "gpu_count": 0, "cpu_count": 1, "memory_gb": 1.0},
            "runtime_env": {},
            "stop_grace_s": 10.0,
        }
        row = (run_id, exp_id, "command", "local", digest, submission, request, created, user)
        seed.events.append(
            (created, user, "run.created", run_id, None,
             {"bundle_digest": digest, "template_id": "local", "task_type": "command"})
        )  # fmt: skip
        roll = rng.random()
        ends: list[tuple[str, str | None, int | None]]  # (state, reason, exit code)
        if roll < 0.78:
            ends = [("succeeded", None, 0)]
        elif roll < 0.90:
            ends = [("failed", "task_exit_nonzero", 1)]
        elif roll < 0.94:
            ends = [("terminated", "cancelled", None)]
        else:  # an infrastructure failure, retried at once; the retry mostly succeeds
            ends = [("failed", "runtime_lost", None)]
            ends.append(
                ("succeeded", None, 0) if rng.random() < 0.8 else ("failed", "task_exit_nonzero", 2)
            )
        seed.runs.append((*row, None, ends[-1][0]))  # runs.state: its last attempt's
        at = created
        for number, (state, reason, exit_code) in enumerate(ends, start=1):
            at = _attempt(seed, rng, run_id, number, state, reason, exit_code, at, user)
            if number < len(ends):
                seed.events.append(
                    (at, "orbit", "run.auto_retry", run_id, f"{run_id}-{number}",
                     {"reason": reason, "retry": number, "max_retries": 2, "backoff_s": 0.0})
                )  # fmt: skip
    return seed


def _attempt(
    seed: Seed,
    rng: random.Random,
    run_id: str,
    number: int,
    state: str,
    reason: str | None,
    exit_code: int | None,
    at: datetime,
    user: str,
) -> datetime:
    """One attempt's row and events, from its creation at `at` to its end; returns the end."""
    attempt_id = f"{run_id}-{number}"
    trigger = "submit" if number == 1 else "auto_retry"
    actor = user if number == 1 else "orbit"
    location = f"{WORK_ROOT}/{attempt_id}"
    launched = at + timedelta(milliseconds=50 + rng.random() * 200)
    started = launched + timedelta(seconds=1 + rng.random() * 4)
    ended = started + timedelta(minutes=1 + rng.random() * 120)
    handle = {
        "backend_key": "local_host_process",
        "target": "localhost",
        "attempt_id": attempt_id,
        "location": location,
        "data": {"pid": rng.randrange(1000, 4_000_000)},
    }
    cancelled = reason == "cancelled"
    message = {"task_exit_nonzero": f"exit code {exit_code}", "runtime_lost": "the wrapper is gone",
               "cancelled": "cancelled by the user"}.get(reason or "")  # fmt: skip
    seed.attempts.append(
        (attempt_id, run_id, number, state, reason, "localhost", "local_host_process", trigger,
         handle, exit_code, message, cancelled, at, ended, started, ended, ended, None, None,
         None, None)
    )  # fmt: skip
    ids = (run_id, attempt_id)
    seed.events += [
        (at, actor, "attempt.created", *ids,
         {"number": number, "target": "localhost", "trigger": trigger}),
        (launched, actor, "attempt.state", *ids, {"from": "prepared", "to": "submitted"}),
        (launched, actor, "run.submitted", *ids,
         {"backend": "local_host_process", "target": "localhost", "location": location}),
        (started, "orbit", "attempt.state", *ids, {"from": "submitted", "to": "starting"}),
        (started + timedelta(seconds=1), "orbit", "attempt.state", *ids,
         {"from": "starting", "to": "running"}),
    ]  # fmt: skip
    if cancelled:
        seed.events.append((ended - timedelta(seconds=2), user, "run.cancel_requested", *ids, {}))
    moved: dict[str, Any] = {"from": "running", "to": state}
    if reason is not None:
        moved["reason"] = reason
    if exit_code is not None:
        moved["exit_code"] = exit_code
    if message:
        moved["message"] = message
    seed.events.append((ended, "orbit", "attempt.state", *ids, moved))
    return ended


def write_seed(store: Store, seed: Seed) -> None:
    """Insert the planned rows into a new store in one write transaction (the events under the
    audit chain's lock, as append_event takes it)."""
    driver = store.db.driver
    conn = store.db.connect()
    try:
        postgres = store.dialect == "postgresql"
        # The indexes are made again once the rows are in (a bulk load's usual way: the events'
        # unique hash indexes would take each insert at a random place), with the statements
        # the migrations ran, so that the store ends as it would have. Not the primary keys.
        if postgres:
            cur = conn.cursor()
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (AUDIT_LOCK_KEY,))
            # nor checks the foreign keys row by row (pg_restore --disable-triggers): the seed
            # holds together by construction (a superuser's setting: the bench's own database)
            cur.execute("SET LOCAL session_replication_role = replica")
            cur.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
                "AND tablename IN ('runs', 'attempts', 'events') "
                "AND indexname NOT IN (SELECT conname FROM pg_constraint)"
            )
        else:
            conn.execute("PRAGMA cache_size = -1000000")  # 1 GB, for this load only
            conn.execute("BEGIN IMMEDIATE")
            cur = conn.cursor()
            cur.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL "
                "AND tbl_name IN ('runs', 'attempts', 'events')"
            )
        indexes = cur.fetchall()
        for name, _ in indexes:
            cur.execute(f'DROP INDEX "{name}"')
        cur.execute("SELECT count(*) FROM events")
        if cur.fetchone()[0]:
            raise RuntimeError("the seed's audit chain starts the store's: give it a new store")

        def encode(row: tuple[Any, ...]) -> tuple[Any, ...]:
            return tuple(
                driver.encode_time(v)
                if isinstance(v, datetime)
                else json.dumps(v)
                if isinstance(v, dict)
                else v
                for v in row
            )

        tables = [
            ("experiments", "id, name, created_at", seed.experiments),
            ("runs", RUN_COLS, seed.runs),
            ("attempts", ATTEMPT_COLS, seed.attempts),
            ("events", EVENT_COLS, seed.chained),
        ]
        for table, columns, rows in tables:
            if postgres:
                with cur.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(encode(row))
            else:
                marks = ", ".join("?" * len(columns.split(",")))
                cur.executemany(
                    f"INSERT INTO {table} ({columns}) VALUES ({marks})", map(encode, rows)
                )
        for _, sql in indexes:
            cur.execute(sql)
        conn.commit() if postgres else conn.execute("COMMIT")
        if postgres:  # a settled database, as autovacuum leaves it after a bulk load
            conn.autocommit = True
            conn.execute("VACUUM ANALYZE")
    finally:
        conn.close()


# -- the server ---------------------------------------------------------------------------------


class Server:
    """One `python -m orbit server` process on a free port, stopped by its id."""

    def __init__(
        self, home: Path, url: str, *, loops: bool = True, failpoints: str | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "ORBIT_HOME": str(home)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
        for name in ("ORBIT_DATABASE_URL", "ORBIT_FAILPOINTS", "ORBIT_SERVER", "ORBIT_TOKEN"):
            env.pop(name, None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # as an installed server runs: from bytecode
        if failpoints:
            env["ORBIT_FAILPOINTS"] = failpoints
        argv = [*ORBIT, "server", "--port", str(self.port), "--database-url", url]
        if not loops:
            argv.append("--no-loops")
        self.log = home / f"server-{self.port}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.process = psutil.Process(self.proc.pid)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"orbit server exited: {self.log.read_text()[-2000:]}")
            with suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/healthz", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"orbit server did not answer: {self.log.read_text()[-2000:]}")
            time.sleep(0.1)
        self.token = (home / "admin-token").read_text().strip()

    def stop(self) -> None:
        stop(self.proc)

    def metric(self, name: str) -> float:
        headers = {"Authorization": f"Bearer {self.token}"}  # /metrics is for the admin
        response = httpx.get(f"{self.url}/metrics", headers=headers, timeout=30)
        response.raise_for_status()
        text = response.text
        return sum(
            float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")
        )


@contextmanager
def serving(home: Path, url: str, **kw: Any) -> Iterator[Server]:
    server = Server(home, url, **kw)
    try:
        yield server
    finally:
        server.stop()


def http_times(server: Server, paths: Callable[[], str], n: int, warmup: int) -> dict[str, float]:
    """ms per request, one at a time on one keep-alive connection, after `warmup` untimed; and
    the server's CPU per request (what the figure costs it, whatever else runs beside it)."""
    headers = {"Authorization": f"Bearer {server.token}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
        for _ in range(warmup):
            client.get(paths()).raise_for_status()
        times = []
        cpu0 = cpu_s(server.process)
        for _ in range(n):
            path = paths()
            start = time.perf_counter()
            response = client.get(path)
            times.append((time.perf_counter() - start) * 1000)
            response.raise_for_status()
        cpu = cpu_s(server.process) - cpu0
    return {**summary(times), "server_cpu_ms_each": round(1000 * cpu / n, 2)}


def submit_worker(url: str, token: str, folder: str, count: int, barrier: Any, out: Any) -> None:
    """One client process: one untimed submission, then `count` timed ones after the barrier."""
    from orbit.client.remote import RemoteControl
    from orbit.model.spec import load_spec, to_submission

    spec = Path(folder) / "spec.yaml"
    submission = to_submission(load_spec(spec), str(spec))
    api = RemoteControl(url, token)
    try:
        api.submit_task(submission, base_dir=Path(folder), source=str(spec))
        barrier.wait()
        cpu, spans = time.process_time(), []
        for _ in range(count):
            start = time.monotonic()
            run = api.submit_task(submission, base_dir=Path(folder), source=str(spec))
            spans.append((start, time.monotonic()))
            assert run.state == "prepared", run.state
        out.put({"spans": spans, "cpu_s": time.process_time() - cpu})
    except BaseException as exc:
        out.put({"error": repr(exc)})
        raise
    finally:
        api.close()


def sweep(server: Server, scratch: Path, points: int) -> dict[str, Any]:
    """One `orbit submit --sweep i=1..N` through RemoteControl: the time from the call to the
    group's answer (all N runs written and queued), and the server's CPU per run."""
    from orbit.client.remote import RemoteControl
    from orbit.model.spec import load_spec, to_submission
    from orbit.model.sweeps import Sweep

    folder = scratch / "sweep"
    folder.mkdir(exist_ok=True)
    spec = folder / "spec.yaml"
    spec.write_text(SPEC.replace("'true'", "'echo {i}'"), encoding="utf-8")
    submission = to_submission(load_spec(spec), str(spec))
    api = RemoteControl(server.url, server.token)
    try:
        cpu0, start = cpu_s(server.process), time.monotonic()
        group = api.submit_sweep(
            submission, Sweep(grid={"i": f"1..{points}"}), base_dir=folder, source=str(spec)
        )
        wall = time.monotonic() - start
        cpu = cpu_s(server.process) - cpu0
    finally:
        api.close()
    assert group.size == points and group.counts == {"prepared": points}, group.counts
    return {
        "points": points,
        "wall_s": round(wall, 2),
        "per_s": round(points / wall, 1),
        "server_cpu_ms_each": round(1000 * cpu / points, 2),
    }


def submissions(server: Server, scratch: Path, total: int) -> dict[str, Any]:
    folder = scratch / "job"
    folder.mkdir(exist_ok=True)
    (folder / "spec.yaml").write_text(SPEC, encoding="utf-8")
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(CLIENTS + 1), ctx.Queue()
    each = max(total // CLIENTS, 1)
    workers = [
        ctx.Process(
            target=submit_worker, args=(server.url, server.token, str(folder), each, barrier, out)
        )
        for _ in range(CLIENTS)
    ]
    for w in workers:
        w.start()
    try:
        barrier.wait(timeout=120)  # every client has started and submitted once
        cpu0 = cpu_s(server.process)
        results = [out.get(timeout=600) for _ in workers]
        server_cpu = cpu_s(server.process) - cpu0
    finally:
        for w in workers:
            w.join(timeout=30)
            if w.is_alive():
                w.kill()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError(f"a submitting client failed: {errors[0]}")
    spans = [s for r in results for s in r["spans"]]
    wall = max(end for _, end in spans) - min(start for start, _ in spans)
    return {
        "n": len(spans),
        "clients": CLIENTS,
        "client_kind": "processes",
        "per_s": round(len(spans) / wall, 1),
        "latency": summary([(end - start) * 1000 for start, end in spans]),
        "server_cpu_ms_each": round(1000 * server_cpu / len(spans), 2),
        "server_cpu_pct": round(100 * server_cpu / wall, 1),
        "client_cpu_ms_each": round(1000 * sum(r["cpu_s"] for r in results) / len(spans), 2),
    }


# -- one database -------------------------------------------------------------------------------


@contextmanager
def database(kind: str, home: Path, admin_url: str) -> Iterator[str]:
    """A new store: $home/orbit.db, or a scratch PostgreSQL database dropped afterwards."""
    home.mkdir(parents=True)
    if kind == "sqlite":
        yield f"sqlite:///{home / 'orbit.db'}"
        return
    import psycopg

    name = f"orbit_bench_{os.getpid()}_{home.name}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield f"{admin_url.rpartition('/')[0]}/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def add_run(store: Store, experiment: str, seed: Seed, i: int) -> RunRecord:
    """The seed's run `i`, made through the store's own call (launched by no one)."""
    return store.runs.create_run(
        experiment_id=experiment,
        task_type="command",
        template_id="local",
        bundle_digest=seed.runs[i][4],
        submission=TaskSubmission.model_validate(seed.runs[i][5]),
        request=ExecutionRequest.model_validate(seed.runs[i][6]),
        actor="bench",
    )


def one_page(url: str, seed: Seed) -> None:
    """PAGE ended runs, through the store's own calls."""
    store = Store(url)
    try:
        experiment = store.experiments.create_experiment("sft", "bench").id
        for i in range(PAGE):
            run = add_run(store, experiment, seed, i)
            store.attempts.move_attempt(
                run.current.id, RunState.SUCCEEDED, actor="bench", exit_code=0
            )
    finally:
        store.close()


def measure_database(
    kind: str, sz: Sizes, seed: Seed, admin_url: str, say: Callable[[str], None]
) -> dict[str, Any]:
    rng = random.Random(1123)
    report: dict[str, Any] = {"loadavg_before": round(os.getloadavg()[0], 2)}
    list_path = f"/api/v1/runs?limit={PAGE}"
    with tempfile.TemporaryDirectory(prefix=f"orbit-bench-api-{kind}-") as scratch_name:
        scratch = Path(scratch_name)
        empty = scratch / "empty"
        with database(kind, empty, admin_url) as url, serving(empty, url) as server:
            report["list_empty"] = http_times(server, lambda: list_path, sz.lists, warmup=20)
            say(f"{kind}: empty store: list {report['list_empty']}")
            one_page(url, seed)  # then a store of one page of runs: what a page costs
            report["list_page"] = http_times(server, lambda: list_path, sz.lists, warmup=20)
            say(f"{kind}: {PAGE} runs: list {report['list_page']}")

        home = scratch / "home"
        with database(kind, home, admin_url) as url:
            start = time.monotonic()
            store = Store(url)
            try:
                write_seed(store, seed)
                assert store.runs.count_runs() == sz.runs
                if sz.runs <= 10_000:
                    assert store.audit.check_audit().intact, "the seeded audit chain is broken"
                if kind == "postgres":
                    with store.db.transaction(write=False) as tx:
                        report["server_version"] = tx.scalar("SHOW server_version")
            finally:
                store.close()
            report["seed"] = {
                "runs": sz.runs,
                "attempts": len(seed.attempts),
                "events": len(seed.chained),
                "write_s": round(time.monotonic() - start, 1),
            }
            say(f"{kind}: seeded {report['seed']}")

            ids = seed.run_ids
            with serving(home, url) as server:  # the first start: the admin and its token
                report["show"] = http_times(
                    server, lambda: f"/api/v1/runs/{rng.choice(ids)}", sz.show, warmup=50
                )
                report["list"] = http_times(server, lambda: list_path, sz.lists, warmup=20)
                say(f"{kind}: show {report['show']}; list {report['list']}")
                cli_env = {
                    **os.environ,
                    "ORBIT_SERVER": server.url,
                    "ORBIT_TOKEN": server.token,
                    "ORBIT_HOME": str(scratch / "client-home"),
                    "COLUMNS": "120",
                }
                cli_env.pop("PYTHONDONTWRITEBYTECODE", None)
                cli_env.pop("ORBIT_DATABASE_URL", None)
                report["cli_start"] = timed_processes([*ORBIT, "--version"], cli_env, sz.cli)
                report["cli_show"] = timed_processes(
                    [*ORBIT, "runs", "show", rng.choice(ids)], cli_env, sz.cli
                )
                report["cli_list"] = timed_processes(
                    [*ORBIT, "runs", "list", "--limit", "50"], cli_env, sz.cli
                )
                say(f"{kind}: CLI runs show {report['cli_show']}; list {report['cli_list']}")
                time.sleep(1)
                report["idle"] = idle(server.process, sz.idle_s)
                say(f"{kind}: idle {report['idle']}")

            store = Store(url)
            try:
                experiment = store.experiments.get_experiment("sft").id
                for i in range(ACTIVE_RUNS):  # as submitted with no launcher: due a launch
                    add_run(store, experiment, seed, i)
            finally:
                store.close()
            with serving(home, url, failpoints="launch=skip") as server:
                time.sleep(3)  # the loop's first passes
                looked = server.metric("orbit_reconciled_attempts_total")
                report["idle_active"] = idle(server.process, sz.idle_s)
                looks = server.metric("orbit_reconciled_attempts_total") - looked
                report["idle_active"]["active_runs"] = ACTIVE_RUNS
                report["idle_active"]["looks_per_s"] = round(looks / sz.idle_s, 1)
                say(f"{kind}: idle with {ACTIVE_RUNS} prepared runs {report['idle_active']}")

            with serving(home, url, loops=False, failpoints="launch=skip") as server:
                report["submit"] = submissions(server, scratch, sz.submissions)
                say(f"{kind}: submissions {report['submit']}")
                report["sweep"] = sweep(server, scratch, sz.sweep)
                say(f"{kind}: sweep {report['sweep']}")
    report["loadavg_after"] = round(os.getloadavg()[0], 2)
    return report


# -- the report ---------------------------------------------------------------------------------


def rows(db: dict[str, Any], slurm: dict[str, Any] | None) -> list[dict[str, Any]]:
    def row(
        metric: str,
        orbit: float,
        peer: float | None = None,
        goal: str = "",
        met: bool | None = None,
    ) -> dict[str, Any]:
        ratio = round(orbit / peer, 2) if peer else None
        return {"metric": metric, "orbit": orbit, "slurm": peer, "ratio": ratio, "goal": goal,
                "met": met}  # fmt: skip

    s = slurm or {}
    show99, list99, empty99 = db["show"]["p99_ms"], db["list"]["p99_ms"], db["list_empty"]["p99_ms"]
    vs_empty = round(list99 / empty99, 2)
    idle_cpu, idle_rss = db["idle"]["cpu_pct"], db["idle"]["rss_mb"]
    rate = db["submit"]["per_s"]
    return [
        row("show p50 ms (HTTP)", db["show"]["p50_ms"]),
        row("show p99 ms (HTTP)", show99, None, "<= 20", show99 <= GOALS["show_p99_ms"]),
        row("  server CPU ms per show", db["show"]["server_cpu_ms_each"]),
        row("orbit runs show / squeue -j, ms", db["cli_show"]["median_ms"],
            s.get("squeue_j", {}).get("median_ms")),
        row("  orbit --version (start-up), ms", db["cli_start"]["median_ms"]),
        row("list p50 ms (HTTP, N runs)", db["list"]["p50_ms"]),
        row("list p99 ms (HTTP, N runs)", list99, None, "<= 50", list99 <= GOALS["list_p99_ms"]),
        row("  server CPU ms per list (N runs)", db["list"]["server_cpu_ms_each"]),
        row("list p50 ms (HTTP, empty store)", db["list_empty"]["p50_ms"]),
        row("list p99 ms (HTTP, empty store)", empty99),
        row("  server CPU ms per list (empty)", db["list_empty"]["server_cpu_ms_each"]),
        row("list p99, N runs / empty", vs_empty, None, "<= 2", vs_empty <= GOALS["list_vs_empty"]),
        row(f"list p50 ms (HTTP, {PAGE} runs)", db["list_page"]["p50_ms"]),
        row(f"list p99 ms (HTTP, {PAGE} runs)", db["list_page"]["p99_ms"]),
        row(f"  server CPU ms per list ({PAGE} runs)", db["list_page"]["server_cpu_ms_each"]),
        row(f"list p99, N runs / {PAGE} runs", round(list99 / db["list_page"]["p99_ms"], 2)),
        row("orbit runs list / squeue, ms", db["cli_list"]["median_ms"],
            s.get("squeue", {}).get("median_ms")),
        row("queued submissions/s, 16 clients", rate, s.get("sbatch", {}).get("per_s"),
            ">= 1000", rate >= GOALS["submit_per_s"]),
        row("  server CPU ms per submission", db["submit"]["server_cpu_ms_each"],
            s.get("sbatch", {}).get("slurmctld_cpu_ms_each")),
        row("idle CPU % of a core (0 active)", idle_cpu, None, "< 1", idle_cpu < GOAL_IDLE_CPU),
        row("idle RSS MB (0 active)", idle_rss, None, "< 150", idle_rss < GOAL_IDLE_RSS),
        row(f"idle CPU % ({ACTIVE_RUNS} prepared)", db["idle_active"]["cpu_pct"]),
        row(f"idle RSS MB ({ACTIVE_RUNS} prepared)", db["idle_active"]["rss_mb"]),
    ]  # fmt: skip


def print_table(kind: str, runs: int, db: dict[str, Any]) -> None:
    version = f" {db['server_version']}" if "server_version" in db else ""
    print(
        f"\n{kind}{version}: {runs:,} runs in the store (N); ratio = ORBIT / Slurm; load "
        f"average {db['loadavg_before']} before, {db['loadavg_after']} after"
    )
    table = db["table"]
    print(f"{'metric':<36} {'ORBIT':>9} {'Slurm':>9} {'ratio':>7} {'goal':>7}  met?")
    for r in table:
        peer = "-" if r["slurm"] is None else f"{r['slurm']:.1f}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        met = "" if r["met"] is None else ("yes" if r["met"] else "NO")
        print(f"{r['metric']:<36} {r['orbit']:>9.2f} {peer:>9} {ratio:>7} {r['goal']:>7}  {met}")


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def add_postgres_url(parser: argparse.ArgumentParser) -> None:
    """--postgres-url, where a bench makes and drops its scratch PostgreSQL database."""
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("ORBIT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
        help="a PostgreSQL database to CREATE/DROP the scratch database from",
    )  # fmt: skip


def database_kinds(parser: argparse.ArgumentParser, databases: str) -> list[str]:
    """--databases as a list; the parser's error for a name that is neither store."""
    kinds = [k.strip() for k in databases.split(",") if k.strip()]
    if unknown := set(kinds) - {"sqlite", "postgres"}:
        parser.error(f"unknown databases: {', '.join(sorted(unknown))}")
    return kinds


def sayer(began: float) -> Callable[[str], None]:
    """A progress line on stderr, with the seconds since `began` and the load average."""

    def say(line: str) -> None:
        load = os.getloadavg()[0]
        print(
            f"[{time.monotonic() - began:6.1f}s load {load:4.1f}] {line}",
            file=sys.stderr,
            flush=True,
        )

    return say


def slurm_missing(no_slurm: bool) -> str:
    """Why Slurm is left out of this run ("" when it can be measured here)."""
    if no_slurm:
        return "--no-slurm"
    if os.geteuid() != 0:
        return "not root (Slurm's daemons run as root here)"
    if not all(shutil.which(t) for t in ("slurmctld", "slurmd", "munged", "sbatch", "squeue")):
        return "slurm-wlm/munge not installed"
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="runs in the store (100,000)")
    parser.add_argument("--quick", action="store_true", help="5,000 runs, fewer samples")
    parser.add_argument("--databases", default="sqlite,postgres", help="sqlite,postgres")
    parser.add_argument("--no-slurm", action="store_true", help="leave Slurm out")
    parser.add_argument("--idle-s", type=float, default=30.0, help="idle window (not --quick)")
    parser.add_argument("--sweep-points", type=int, default=None, help="one sweep's (10,000)")
    add_postgres_url(parser)
    parser.add_argument("--json", metavar="FILE", help="write the figures as JSON to FILE")
    args = parser.parse_args()
    kinds = database_kinds(parser, args.databases)
    sz = sizes(args)
    if args.sweep_points:
        sz.sweep = args.sweep_points
    began = time.monotonic()
    say = sayer(began)

    result: dict[str, Any] = {"sizes": sz.__dict__, "machine_before": machine(), "databases": {}}
    slurm: dict[str, Any] | None = None
    why = slurm_missing(args.no_slurm)
    if why:
        say(f"Slurm left out: {why}")
    else:
        slurm = measure_slurm(sz)
        say(f"slurm {slurm['version']}: {slurm}")
    result["slurm"] = slurm or {"skipped": why}

    start = time.monotonic()
    gc.disable()  # millions of new, long-lived objects: the cyclic GC would walk them all again
    seed = plan_seed(sz.runs, random.Random(20261123))
    seed.chain()
    gc.freeze()  # and once made, never again
    gc.enable()
    took = time.monotonic() - start
    say(f"planned {sz.runs:,} runs, {len(seed.chained):,} events in {took:.1f} s")
    for kind in kinds:
        db = measure_database(kind, sz, seed, args.postgres_url, say)
        db["table"] = rows(db, slurm)
        result["databases"][kind] = db
    result["machine_after"] = machine()
    result["seconds"] = round(time.monotonic() - began, 1)

    m0, m1 = result["machine_before"], result["machine_after"]
    print(
        f"\n{m0['cpus']} CPUs ({m0['cpu']}), Python {m0['python']}, SQLite {m0['sqlite']}, "
        f"Slurm {slurm['version'] if slurm else '- (' + why + ')'}; load average "
        f"{m0['loadavg'][0]} before, {m1['loadavg'][0]} after; {result['seconds']:.0f} s in all"
    )
    if slurm:
        print(
            f"Slurm: {slurm['sbatch']['n']} `sbatch --hold` from {CLIENTS} threads; squeue "
            f"lists the {slurm['queued']} jobs then queued"
        )
    for kind, db in result["databases"].items():
        print_table(kind, sz.runs, db)
        sub = db["submit"]
        print(
            f"  submissions: {sub['n']} from {CLIENTS} client processes, p50 "
            f"{sub['latency']['p50_ms']} ms, p99 {sub['latency']['p99_ms']} ms each; server "
            f"{sub['server_cpu_pct']}% of a core; clients {sub['client_cpu_ms_each']} ms CPU each"
        )
        swept = db["sweep"]
        print(
            f"  a sweep of {swept['points']:,} points queued in {swept['wall_s']} s "
            f"({swept['per_s']} runs/s; server {swept['server_cpu_ms_each']} ms CPU a run; "
            "goal: 10,000 in <= 2 s)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
