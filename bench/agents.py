"""Benchmark: how many agents one `orbit server` keeps, and what an idle `orbit agent` costs.

Run from the repository root:

    PYTHONPATH=src .venv/bin/python bench/agents.py                  # 100 ... 2,000 agents
    PYTHONPATH=src .venv/bin/python bench/agents.py --quick          # 100, 500, 1,000 (< 2 min)
    PYTHONPATH=src .venv/bin/python bench/agents.py --steps 100,1000 --window-s 30 --json out.json
    PYTHONPATH=src .venv/bin/python bench/agents.py --idle           # one real agent, 60 s

Simulated agents (the default mode): one real `orbit server` process (python -m orbit server,
its loops on, a scratch SQLite store or with --database postgres a scratch PostgreSQL
database) and --processes client processes, each an asyncio loop of lightweight agents that
speak the real protocol with their own httpx.AsyncClient (their own connections): each
registers through POST /api/v1/agent/register (one join token for all), syncs once (POST
/sync, as `orbit agent` does on connecting), then keeps a long-poll open (POST /poll, wait_s
25, at once again when it returns) and sends POST /heartbeat every --heartbeat-s seconds (5,
the server's default; the server is told the same), each agent at its own phase. The number of
agents goes up in --steps; at each, once every new agent has heartbeated twice, for --window-s
seconds: the heartbeats' round trip p50/p99/max as the agents see it (and, from the server's
own request histogram on /metrics, the bucket under which 50 and 99% were answered once the
request reached the app: the rest is HTTP parsing, the event loop's queue and the client's own
delay), the server's CPU (% of
one core, all its threads) and RSS, how many nodes the store has seen within two heartbeat
intervals, and, so that a slow client is not taken for a slow server, the client processes'
CPU and their event loops' worst lag. Reported: the largest N whose heartbeat p99 < 1 s.
Goal (the issue): >= 1,000 agents on this 2-core machine.

--idle: one real `orbit agent` (python -m orbit agent, from compiled bytecode as an installed
one runs) joined to a real server, nothing to run: after it has connected and settled, its
CPU (% of one core, from psutil's cpu_times over --idle-s seconds, 60 by default) and RSS.
Goal: < 0.5% of a core, < 60 MB.

Every figure comes from this machine in this run; the load average before and after is
printed, as other work on the machine moves the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import random
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psutil

# bench/api.py: the server process, scratch databases and the figures
from api import SRC, Server, add_postgres_url, cpu_s, database, machine, pct, sayer, stop

from orbit.core.control.service import CoreControlService
from orbit.model.config import Settings
from orbit.wire import protocol as p

GOAL_AGENTS = 1000
GOAL_P99_S = 1.0
GOAL_IDLE_CPU = 0.5  # % of one core
GOAL_IDLE_RSS = 60.0  # MB
POLL_WAIT_S = 25.0


# -- the simulated agents (in client processes) -------------------------------------------------


class Sim:
    """One simulated agent: its own connections, a long-poll and a heartbeat loop."""

    def __init__(self, url: str, name: str, tls: ssl.SSLContext, stats: dict[str, Any]):
        self.name, self.stats = name, stats
        self.http = httpx.AsyncClient(
            base_url=url,
            verify=tls,
            timeout=httpx.Timeout(30.0, read=POLL_WAIT_S + 30.0),
            limits=httpx.Limits(max_connections=4, max_keepalive_connections=4),
            headers={p.VERSION_HEADER: str(p.PROTOCOL_VERSION), "content-type": "application/json"},
        )
        self.session = os.urandom(8).hex()
        self.node_id = ""

    async def join(self, join_token: str) -> None:
        body = p.RegisterRequest(
            join_token=join_token, name=self.name, max_tasks=1,
            info=p.NodeInfo(agent_version="bench", hostname=self.name),
        )  # fmt: skip
        r = await self.http.post(p.REGISTER_PATH, content=body.model_dump_json())
        r.raise_for_status()
        answer = p.RegisterResponse.model_validate_json(r.content)
        self.node_id = answer.node_id
        self.http.headers["authorization"] = f"Bearer {answer.credential}"
        await self.sync()

    async def sync(self) -> None:
        body = p.SyncRequest(node_id=self.node_id, session=self.session)
        r = await self.http.post(p.PREFIX + "/sync", content=body.model_dump_json())
        r.raise_for_status()

    async def heartbeats(self, every_s: float, phase_s: float) -> None:
        loop = asyncio.get_running_loop()
        body = p.HeartbeatRequest(node_id=self.node_id, session=self.session).model_dump_json()
        due = loop.time() + phase_s
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            due += every_s
            start = time.perf_counter()
            try:
                r = await self.http.post(p.PREFIX + "/heartbeat", content=body)
                ok = r.status_code == 200
            except httpx.HTTPError:
                ok = False
            took = time.perf_counter() - start
            if self.stats["measuring"]:
                self.stats["rtt"].append(took)
                if not ok:
                    self.stats["hb_errors"] += 1
            if due < loop.time():  # a round trip longer than the interval: no burst after it
                due = loop.time()

    async def polls(self) -> None:
        body = p.PollRequest(
            node_id=self.node_id, session=self.session, wait_s=POLL_WAIT_S
        ).model_dump_json()
        while True:
            try:
                r = await self.http.post(p.PREFIX + "/poll", content=body)
                ok = r.status_code == 200
                resync = ok and bool(r.json().get("resync"))
            except httpx.HTTPError:
                ok, resync = False, False
            if self.stats["measuring"]:
                self.stats["polls"] += 1
                self.stats["poll_errors"] += 0 if ok else 1
            if resync:
                await self.sync()
            if not ok:
                await asyncio.sleep(1.0)


async def lag_probe(stats: dict[str, Any]) -> None:
    """How late this event loop wakes: a busy client would pass its lag off as the server's."""
    loop = asyncio.get_running_loop()
    while True:
        start = loop.time()
        await asyncio.sleep(0.1)
        late = loop.time() - start - 0.1
        if stats["measuring"]:
            stats["lag"] = max(stats["lag"], late)


async def join(sim: Sim, token: str, gate: asyncio.Semaphore) -> None:
    async with gate:
        await sim.join(token)


async def client_main(url: str, join_token: str, every_s: float, conn: Any, seed: int) -> None:
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    tls = ssl.create_default_context()  # one for all (httpx would load the CA file per client)
    stats: dict[str, Any] = {"measuring": False, "rtt": [], "hb_errors": 0, "polls": 0,
                             "poll_errors": 0, "lag": 0.0}  # fmt: skip
    sims: list[Sim] = []
    tasks: list[asyncio.Task[None]] = [asyncio.create_task(lag_probe(stats))]
    cpu = wall = 0.0
    gate = asyncio.Semaphore(8)  # registrations at once
    while True:
        command, arg = await loop.run_in_executor(None, conn.recv)
        if command == "add":  # arg: the new agents' names
            started = time.monotonic()
            new = [Sim(url, name, tls, stats) for name in arg]
            await asyncio.gather(*(join(s, join_token, gate) for s in new))
            for sim in new:
                tasks.append(asyncio.create_task(sim.polls()))
                tasks.append(asyncio.create_task(sim.heartbeats(every_s, rng.random() * every_s)))
            sims += new
            gc.collect()
            gc.freeze()  # the agents live to the end: no collection walks them again
            conn.send({"joined": len(new), "seconds": time.monotonic() - started})
        elif command == "start":
            stats.update(measuring=True, rtt=[], hb_errors=0, polls=0, poll_errors=0, lag=0.0)
            cpu, wall = time.process_time(), time.monotonic()
            conn.send({})
        elif command == "end":
            stats["measuring"] = False
            conn.send({
                "rtt": stats["rtt"], "hb_errors": stats["hb_errors"], "polls": stats["polls"],
                "poll_errors": stats["poll_errors"], "lag_s": stats["lag"],
                "cpu_pct": 100 * (time.process_time() - cpu) / (time.monotonic() - wall),
                "rss_mb": psutil.Process().memory_info().rss / 1e6,
            })  # fmt: skip
        elif command == "stop":
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(*(s.http.aclose() for s in sims), return_exceptions=True)
            conn.send({})
            return


def client_process(url: str, join_token: str, every_s: float, conn: Any, seed: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent says when to stop
    asyncio.run(client_main(url, join_token, every_s, conn, seed))


# -- the server side ----------------------------------------------------------------------------


def join_token(home: Path, url: str) -> str:
    service = CoreControlService.from_settings(Settings(home=home, database_url=url), actor="bench")
    try:
        return service.create_join_token({}).token
    finally:
        service.close()


def seen_recently(home: Path, url: str, within_s: float) -> int:
    service = CoreControlService.from_settings(Settings(home=home, database_url=url), actor="bench")
    try:
        cutoff = datetime.now(UTC) - timedelta(seconds=within_s)
        return sum(1 for n in service.list_nodes() if n.last_seen_at and n.last_seen_at >= cutoff)
    finally:
        service.close()


@contextmanager
def heartbeat_env(seconds: float) -> Iterator[None]:
    """The server started inside tells its agents to heartbeat every `seconds`."""
    old = os.environ.get("ORBIT_NODE_HEARTBEAT_S")
    os.environ["ORBIT_NODE_HEARTBEAT_S"] = str(seconds)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("ORBIT_NODE_HEARTBEAT_S", None)
        else:
            os.environ["ORBIT_NODE_HEARTBEAT_S"] = old


def simulate(args: argparse.Namespace, steps: list[int], say: Any) -> dict[str, Any]:
    result: dict[str, Any] = {"steps": []}
    with tempfile.TemporaryDirectory(prefix="orbit-bench-agents-") as name:
        home = Path(name) / "home"
        with (
            database(args.database, home, args.postgres_url) as url,
            heartbeat_env(args.heartbeat_s),
        ):
            server = Server(home, url)
            ctx = multiprocessing.get_context("spawn")
            pipes, procs = [], []
            try:
                token = join_token(home, url)
                for i in range(args.processes):
                    mine, theirs = ctx.Pipe()
                    proc = ctx.Process(
                        target=client_process,
                        args=(server.url, token, args.heartbeat_s, theirs, i),
                        daemon=True,
                    )
                    proc.start()
                    pipes.append(mine)
                    procs.append(proc)
                have = 0
                for n in steps:
                    names = [f"sim-{i:05d}" for i in range(have, n)]
                    started = time.monotonic()
                    for i, pipe in enumerate(pipes):
                        pipe.send(("add", names[i :: len(pipes)]))
                    for pipe in pipes:
                        pipe.recv()
                    joined_s = time.monotonic() - started
                    have = n
                    # every new agent heartbeats twice and what joining left behind settles
                    time.sleep(2 * args.heartbeat_s + 2.0)
                    for pipe in pipes:
                        pipe.send(("start", None))
                    for pipe in pipes:
                        pipe.recv()
                    spy = profile(args, server.process.pid, n)
                    buckets = server_buckets(server)
                    cpu0, t0 = cpu_s(server.process), time.monotonic()
                    time.sleep(args.window_s)
                    if spy is not None:
                        spy.wait(timeout=60)
                    for pipe in pipes:
                        pipe.send(("end", None))
                    parts = [pipe.recv() for pipe in pipes]
                    wall = time.monotonic() - t0
                    server_cpu_s = cpu_s(server.process) - cpu0
                    answered = server_buckets(server)
                    server_cpu = 100 * server_cpu_s / wall
                    rtt = [r * 1000 for part in parts for r in part["rtt"]]
                    requests = len(rtt) + sum(part["polls"] for part in parts)
                    step = {
                        "agents": n,
                        "heartbeats": len(rtt),
                        "heartbeats_per_s": round(len(rtt) / wall, 1),
                        "p50_ms": round(pct(rtt, 50), 1) if rtt else None,
                        "p99_ms": round(pct(rtt, 99), 1) if rtt else None,
                        "max_ms": round(max(rtt), 1) if rtt else None,
                        "server_p50_ms": bucket_pct(buckets, answered, 50),
                        "server_p99_ms": bucket_pct(buckets, answered, 99),
                        "hb_errors": sum(part["hb_errors"] for part in parts),
                        "polls_per_s": round(sum(part["polls"] for part in parts) / wall, 1),
                        "poll_errors": sum(part["poll_errors"] for part in parts),
                        "server_cpu_pct": round(server_cpu, 1),
                        "server_cpu_ms_per_request": round(
                            1000 * server_cpu_s / max(requests, 1), 2
                        ),
                        "server_rss_mb": round(server.process.memory_info().rss / 1e6, 1),
                        "server_threads": server.process.num_threads(),
                        "online": seen_recently(home, url, 2 * args.heartbeat_s),
                        "client_cpu_pct": round(sum(part["cpu_pct"] for part in parts), 1),
                        "client_lag_ms": round(1000 * max(part["lag_s"] for part in parts), 1),
                        "join_s": round(joined_s, 1),
                        "loadavg": round(os.getloadavg()[0], 2),
                    }
                    result["steps"].append(step)
                    say(f"{n} agents: {step}")
                    if step["p99_ms"] is None or step["p99_ms"] > args.give_up_ms:
                        say(f"p99 over {args.give_up_ms:.0f} ms: no larger step")
                        break
                for pipe in pipes:
                    pipe.send(("stop", None))
                for pipe in pipes:
                    if pipe.poll(30):
                        pipe.recv()
            finally:
                for proc in procs:
                    proc.join(timeout=10)
                    if proc.is_alive():
                        proc.kill()
                server.stop()
    ok = [s["agents"] for s in result["steps"]
          if s["p99_ms"] is not None and s["p99_ms"] < GOAL_P99_S * 1000 and not s["hb_errors"]
          and s["online"] >= s["agents"]]  # fmt: skip
    result["largest_ok"] = max(ok, default=0)
    return result


HEARTBEAT_ROUTE = p.PREFIX + "/heartbeat"


def server_buckets(server: Server) -> dict[float, float]:
    """The server's own histogram of heartbeat answers (to the answer's start): le -> count."""
    headers = {"authorization": f"Bearer {server.token}"}  # /metrics is for the admin
    response = httpx.get(f"{server.url}/metrics", headers=headers, timeout=30)
    response.raise_for_status()
    text = response.text
    found: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith("orbit_http_request_duration_seconds_bucket{"):
            continue
        labels, _, value = line.rpartition(" ")
        if f'route="{HEARTBEAT_ROUTE}"' not in labels:
            continue
        le = labels.split('le="', 1)[1].split('"', 1)[0]
        bound = float("inf") if le == "+Inf" else float(le)
        found[bound] = found.get(bound, 0.0) + float(value)
    return found


def bucket_pct(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The bucket bound under which `q` % of the window's heartbeats were answered (ms)."""
    delta = {b: after.get(b, 0.0) - before.get(b, 0.0) for b in after}
    total = delta.get(float("inf"), 0.0)
    if total <= 0:
        return None
    for bound in sorted(delta):
        if delta[bound] >= total * q / 100:
            return 1000 * bound
    return None


def profile(args: argparse.Namespace, pid: int, n: int) -> subprocess.Popen[bytes] | None:
    """py-spy on the server over this step's window (--py-spy), its stacks to a file."""
    if not args.py_spy:
        return None
    out = Path(args.profile_dir) / f"server-{n}-agents.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [args.py_spy, "record", "--pid", str(pid), "--format", "raw", "--output", str(out),
            "--duration", str(int(args.window_s)), "--nonblocking", "--rate", "200"]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def print_steps(result: dict[str, Any], args: argparse.Namespace) -> None:
    head = ["agents", "heartbeats/s", "heartbeat p50 ms", "p99 ms", "max ms",
            "in the server p50 / p99 ms (bucket)", "errors",
            "polls/s", "online", "server CPU %", "server CPU ms/request", "server RSS MB",
            "clients CPU %", "client loop lag ms", "load avg"]  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for s in result["steps"]:
        errors = s["hb_errors"] + s["poll_errors"]
        cells = [f"{s['agents']:,}", f"{s['heartbeats_per_s']}", f"{s['p50_ms']}",
                 f"{s['p99_ms']}", f"{s['max_ms']}",
                 f"<= {s['server_p50_ms']} / <= {s['server_p99_ms']}", f"{errors}",
                 f"{s['polls_per_s']}",
                 f"{s['online']:,}", f"{s['server_cpu_pct']}",
                 f"{s['server_cpu_ms_per_request']}", f"{s['server_rss_mb']}",
                 f"{s['client_cpu_pct']}", f"{s['client_lag_ms']}", f"{s['loadavg']}"]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    largest = result["largest_ok"]
    met = "yes" if largest >= GOAL_AGENTS else "NO"
    print(
        f"\nLargest N with heartbeat p99 < 1 s (no errors, every node seen): {largest:,} "
        f"(goal >= {GOAL_AGENTS:,}: {met})"
    )


# -- one real agent, idle -----------------------------------------------------------------------


def idle(args: argparse.Namespace, say: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="orbit-bench-agent-idle-") as name:
        scratch = Path(name)
        home = scratch / "home"
        with database(args.database, home, args.postgres_url) as url:
            server = Server(home, url)
            agent: subprocess.Popen[bytes] | None = None
            try:
                token = join_token(home, url)
                env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
                env["ORBIT_HOME"] = str(scratch / "agent-home")
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
                env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: from bytecode
                env["ORBIT_JOIN_TOKEN"] = token  # taken out of the agent's environment at once
                argv = [sys.executable, "-m", "orbit", "agent", "--server", server.url,
                        "--name", "idle", "--work-dir", str(scratch / "work"),
                        "--max-tasks", "4", "--task-uids", "none"]  # fmt: skip
                log = scratch / "agent.log"
                with log.open("wb") as out:
                    agent = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
                deadline = time.monotonic() + 60
                while seen_recently(home, url, 30) < 1:
                    if agent.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"the agent did not join: {log.read_text()}")
                    time.sleep(0.1)
                process = psutil.Process(agent.pid)
                time.sleep(args.settle_s)  # past its start-up (imports, node info, first sync)
                say(f"agent {agent.pid} connected; measuring for {args.idle_s:.0f} s")
                a0, s0, t0 = cpu_s(process), cpu_s(server.process), time.monotonic()
                peak = 0.0
                while time.monotonic() - t0 < args.idle_s:
                    time.sleep(1.0)
                    peak = max(peak, process.memory_info().rss / 1e6)
                wall = time.monotonic() - t0
                agent_cpu, server_cpu = cpu_s(process) - a0, cpu_s(server.process) - s0
                memory = process.memory_full_info()
                return {
                    "seconds": round(wall, 1),
                    "cpu_pct": round(100 * agent_cpu / wall, 3),
                    "cpu_ms": round(1000 * agent_cpu, 1),
                    "rss_mb": round(memory.rss / 1e6, 1),
                    "rss_peak_mb": round(peak, 1),
                    "uss_mb": round(memory.uss / 1e6, 1),
                    "threads": process.num_threads(),
                    "server_cpu_pct": round(100 * server_cpu / wall, 3),
                    "heartbeat_s": 5.0,
                }
            finally:
                if agent is not None:
                    stop(agent)
                server.stop()


def print_idle(r: dict[str, Any]) -> None:
    cpu_ok = "yes" if r["cpu_pct"] < GOAL_IDLE_CPU else "NO"
    rss_ok = "yes" if r["rss_mb"] < GOAL_IDLE_RSS else "NO"
    print("| idle `orbit agent` | value | goal | met? |")
    print("|---|---|---|---|")
    print(f"| CPU, % of one core over {r['seconds']} s | {r['cpu_pct']} | < 0.5 | {cpu_ok} |")
    print(f"| CPU ms in the window | {r['cpu_ms']} | | |")
    print(f"| RSS MB (end / peak) | {r['rss_mb']} / {r['rss_peak_mb']} | < 60 | {rss_ok} |")
    print(f"| USS MB (its own pages) | {r['uss_mb']} | | |")
    print(f"| threads | {r['threads']} | | |")
    print(f"| the server's CPU meanwhile, % of one core | {r['server_cpu_pct']} | | |")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="steps 100,500,1000, 10 s windows")
    parser.add_argument("--steps", default=None, help="agent counts (100,250,500,1000,2000)")
    parser.add_argument("--window-s", type=float, default=None, help="measured seconds (20)")
    parser.add_argument("--heartbeat-s", type=float, default=5.0, help="heartbeat interval (5)")
    parser.add_argument("--processes", type=int, default=2, help="client processes (2)")
    parser.add_argument("--give-up-ms", type=float, default=5000.0,
                        help="stop stepping once heartbeat p99 passes this (5000)")  # fmt: skip
    parser.add_argument("--py-spy", metavar="PATH", help="profile the server with this py-spy")
    parser.add_argument("--profile-dir", default="bench-profiles", help="--py-spy: stacks here")
    parser.add_argument("--idle", action="store_true", help="one real agent, idle (see above)")
    parser.add_argument("--idle-s", type=float, default=60.0, help="--idle: window (60)")
    parser.add_argument("--settle-s", type=float, default=10.0, help="--idle: wait first (10)")
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    add_postgres_url(parser)
    parser.add_argument("--json", metavar="FILE", help="write the figures as JSON to FILE")
    args = parser.parse_args()
    began = time.monotonic()
    say = sayer(began)

    result: dict[str, Any] = {"machine_before": machine(), "database": args.database}
    if args.idle:
        result["idle"] = idle(args, say)
    else:
        default = "100,500,1000" if args.quick else "100,250,500,1000,2000"
        steps = sorted({int(s) for s in (args.steps or default).split(",") if s.strip()})
        args.window_s = args.window_s or (10.0 if args.quick else 20.0)
        result["simulated"] = simulate(args, steps, say)
    result["machine_after"] = machine()
    result["seconds"] = round(time.monotonic() - began, 1)
    m0, m1 = result["machine_before"], result["machine_after"]
    print(
        f"\n{m0['cpus']} CPUs ({m0['cpu']}), Python {m0['python']}, store {args.database}; "
        f"load average {m0['loadavg'][0]} before, {m1['loadavg'][0]} after; "
        f"{result['seconds']:.0f} s in all\n"
    )
    if args.idle:
        print_idle(result["idle"])
    else:
        print(
            f"{args.processes} client processes of simulated agents (httpx.AsyncClient each, "
            f"register + sync, long-poll wait_s {POLL_WAIT_S:.0f}, heartbeat every "
            f"{args.heartbeat_s:g} s); {args.window_s:g} s measured at each step\n"
        )
        print_steps(result["simulated"], args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
