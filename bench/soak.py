"""Soak: many short pool runs across three agents while faults are injected at random, then a
check that every run reached its true end state and that nothing ran twice.

Run from the repository root:

    PYTHONPATH=src .venv/bin/python bench/soak.py                  # 2,000 runs, SQLite
    PYTHONPATH=src .venv/bin/python bench/soak.py --runs 200 --database postgres

Real processes: one `orbit server` (its store SQLite, or a scratch PostgreSQL database) and
three `orbit agent`s on loopback, each with max_tasks 4. Runs are submitted through the Python
client in waves while a fault thread, every 2-6 s (--fault-every-s), does one of (at random):

    agent-kill     kill -9 one agent, restart it 0.5-3 s later (same work dir and identity)
    agent-freeze   SIGSTOP one agent for 0.5-8 s (a link cut as the server sees it: silence;
                   past the offline timeout its attempts are lost and retried elsewhere, and
                   the node stops them itself: fencing)
    server-kill    kill -9 the server, restart it on the same port 0.5-2 s later
    wrapper-kill   kill -9 one attempt's runtime wrapper (runtime_lost: retried)
    task-kill      kill -9 one attempt's task (task_killed: the task's own end, not retried;
                   such a run may end failed)
    node-revoke    revoke one node (its agent exits, its attempts are lost), then remove it
                   and join it again under its name with a fresh work dir 1-3 s later

Faults go on until nine runs in ten have ended, then stop while the rest settles. The node
timings are shortened (heartbeat 0.5 s, offline after 4 s, lost 2 s later) so that
losses happen within the soak. Each task appends `start RUN ATTEMPT` to a ledger, sleeps
0.05-0.5 s and appends `end RUN ATTEMPT`. At the end (after the last submission, faults stop
and every run is awaited):

    true end state  every run ended; its last attempt succeeded (a lost attempt's retries are
                    ORBIT's to make: max_retries 5), but for runs whose task was killed
    never beside    no attempt's task was still running once its run's next attempt started
    never twice     no attempt id starts twice in the ledger (the fencing check); a run whose
                    node was cut off past the timeout may have finished there as well as in
                    its retry: counted and shown, as the price of declaring a node lost
    freezes         runs that did not end within --settle-s after the faults stopped, and
                    nodes that never came back online (a run or node stuck with no progress
                    longer than the timeouts allow)

Counts are printed as a table: runs, attempts, retries by reason, faults by kind, attempts
that ran on a frozen node and were stopped there (started, never ended in the ledger).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
NODE_ENV = {
    "ORBIT_NODE_HEARTBEAT_S": "0.5",
    "ORBIT_NODE_OFFLINE_S": "4",
    "ORBIT_NODE_LOST_GRACE_S": "2",
}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Proc:
    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.argv, self.env, self.log = argv, env, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            if sig == signal.SIGKILL:
                self.proc.wait()


def wait_healthy(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"the server at {url} did not come up")


def attempt_processes(root: Path, wrapper: bool) -> list[tuple[int, str]]:
    """(pid, run id) of the soak's attempts' wrappers, or of their tasks (the shell each
    attempt's task is: its process group's leader, not what it started)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        env = dict(e.split(b"=", 1) for e in environ if b"=" in e)
        if str(root).encode() not in b" ".join(argv) + env.get(b"ORBIT_BUNDLE_DIR", b""):
            continue
        is_wrapper = any(a.endswith(b"orbit_wrapper.py") for a in argv)
        try:
            is_task = argv[:2] == [b"bash", b"-c"] and os.getpgid(int(name)) == int(name)
        except ProcessLookupError:
            continue
        if (is_wrapper if wrapper else is_task) and b"ORBIT_RUN_ID" in env:
            found.append((int(name), env[b"ORBIT_RUN_ID"].decode()))
    return found


def running_beside_retries(lines: list[str]) -> list[str]:
    """Attempts whose task went on (ended or was stopped) after a later attempt of the same
    run had started: two copies of a job at once. Ledger lines: WORD RUN ATTEMPT TIME."""
    spans: dict[str, dict[str, list[float]]] = collections.defaultdict(dict)
    for line in lines:
        parts = line.split()
        if len(parts) == 4:
            _word, run_id, attempt_id, at = parts
            spans[run_id].setdefault(attempt_id, []).append(float(at))
    found = []
    for attempts in spans.values():
        ordered = sorted(attempts.items(), key=lambda item: min(item[1]))
        for (attempt_id, times), (_later, later_times) in itertools.pairwise(ordered):
            if max(times) > min(later_times):
                found.append(attempt_id)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--settle-s", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--fault-every-s",
        type=float,
        nargs=2,
        default=(2.0, 6.0),
        metavar=("MIN", "MAX"),
        help="the wait between faults, drawn between these (default 2 6)",
    )
    parser.add_argument(
        "--faults-max-s",
        type=float,
        default=600.0,
        help="faults stop after this long even while many runs are still to end (default 600)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="orbit-soak-"))
    home = root / "home"
    home.mkdir()
    db_name = None
    if args.database == "postgres":
        import psycopg

        db_name = f"orbit_soak_{uuid.uuid4().hex[:8]}"
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{db_name}"')
        database_url = f"postgresql://postgres@127.0.0.1:5432/{db_name}"
    else:
        database_url = f"sqlite:///{home / 'orbit.db'}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    py = [sys.executable, "-m", "orbit"]
    server_env = {**base, "ORBIT_HOME": str(home), **NODE_ENV}
    server = Proc(
        [*py, "server", "--port", str(port), "--database-url", database_url],
        server_env,
        root / "server.log",
    )
    server.start()
    wait_healthy(url)
    token = (home / "admin-token").read_text().strip()
    sys.path.insert(0, str(REPO / "src"))
    from orbit.core.control.service import CoreControlService
    from orbit.model.config import Settings
    from orbit.model.errors import StoreError

    service = CoreControlService.from_settings(Settings(home=home, database_url=database_url))
    join = service.create_join_token({"soak": "yes"}).token
    agents = []
    for n in range(3):
        agent = Proc(
            [
                *py,
                "agent",
                "--server",
                url,
                "--task-uids",
                "none",
                "--name",
                f"soak-{n}",
                "--work-dir",
                str(root / f"agent-{n}"),
                "--max-tasks",
                "4",
            ],
            {**base, "ORBIT_HOME": str(root / f"agent-home-{n}"), "ORBIT_JOIN_TOKEN": join},
            root / f"agent-{n}.log",
        )
        agent.start()
        agents.append(agent)
    ledger = root / "ledger"
    ledger.touch()
    from orbit.client import Client

    client = Client(url, token)
    faults: collections.Counter[str] = collections.Counter()
    stop_faults = threading.Event()
    server_lock = threading.Lock()

    killed_runs: set[str] = set()
    generation = collections.Counter[int]()

    def rejoin(n: int) -> None:
        """A revoked node joins again under its name, as a new node with a fresh work dir."""
        victim = agents[n]
        victim.signal(signal.SIGKILL)  # it exits by itself once refused; no need to wait
        time.sleep(rng.uniform(1, 3))
        patiently(lambda: service.remove_node(f"soak-{n}", force=True))
        generation[n] += 1
        fresh = patiently(lambda: service.create_join_token({"soak": "yes"}).token)
        work = f"agent-{n}-{generation[n]}"
        victim.argv[victim.argv.index("--work-dir") + 1] = str(root / work)
        victim.env = {**victim.env, "ORBIT_JOIN_TOKEN": fresh}
        victim.start()

    def patiently(step: Callable[[], Any]) -> Any:
        """A step on the store, again while it is busy (SQLite's writer lock held by the
        server), so that a fault is never left half made."""
        for _ in range(9):
            try:
                return step()
            except StoreError:
                time.sleep(1)
        return step()

    def inject() -> None:
        while not stop_faults.wait(rng.uniform(*args.fault_every_s)):
            try:
                one_fault()
            except Exception as exc:  # a fault it could not make (a node still rejoining)
                faults["faults not made"] += 1
                print(f"fault: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)

    def one_fault() -> None:
        kinds = ["agent-kill", "agent-freeze", "server-kill", "wrapper-kill", "task-kill"]
        kinds.append("node-revoke")
        kind = rng.choice(kinds)
        if kind in ("wrapper-kill", "task-kill"):
            found = attempt_processes(root, wrapper=kind == "wrapper-kill")
            if found:
                pid, run_id = rng.choice(found)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    if kind == "task-kill":
                        killed_runs.add(run_id)
        elif kind == "node-revoke":
            n = rng.randrange(len(agents))
            service.revoke_node(f"soak-{n}")
            rejoin(n)
        elif kind == "agent-kill":
            victim = rng.choice(agents)
            victim.signal(signal.SIGKILL)
            time.sleep(rng.uniform(0.5, 3))
            victim.start()
        elif kind == "agent-freeze":
            victim = rng.choice(agents)
            victim.signal(signal.SIGSTOP)
            try:
                time.sleep(rng.uniform(0.5, 8))
            finally:
                victim.signal(signal.SIGCONT)
        else:
            with server_lock:
                server.signal(signal.SIGKILL)
                time.sleep(rng.uniform(0.5, 2))
                server.start()
                wait_healthy(url)
        faults[kind] += 1  # made (one that failed half way is counted as not made)

    injector = threading.Thread(target=inject, daemon=True)
    injector.start()
    task = (
        f"trap 'echo stop $ORBIT_RUN_ID $ORBIT_ATTEMPT_ID $(date +%s.%N) >> {ledger}; exit 143' "
        "TERM; "
        f"echo start $ORBIT_RUN_ID $ORBIT_ATTEMPT_ID $(date +%s.%N) >> {ledger}; "
        "sleep 0.$((RANDOM % 5)) & wait; "
        f"echo end $ORBIT_RUN_ID $ORBIT_ATTEMPT_ID $(date +%s.%N) >> {ledger}"
    )
    spec = {
        "experiment": "soak",
        "task_type": "command",
        "template": "pool",
        "task": {"command": task},
        "overrides": {"stop_grace_s": 1},
        "retry": {"max_retries": 5, "backoff_s": 0.2, "backoff_max_s": 2},
    }
    run_ids: list[str] = []
    started = time.monotonic()
    while len(run_ids) < args.runs:
        try:
            with server_lock:
                pass
            run_ids.append(client.submit(spec).id)
        except Exception as exc:  # the server was being restarted: submit again
            print(f"submit: {type(exc).__name__}: {str(exc)[:100]}", file=sys.stderr)
            time.sleep(0.5)
    print(f"submitted {len(run_ids)} runs in {time.monotonic() - started:.0f}s")
    http = httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"}, timeout=30)
    pending = set(run_ids)
    final: dict[str, Any] = {}
    settle_from: float | None = None
    while pending:
        # faults go on while most runs are still to end; then they stop, and the rest settles
        few_left = len(pending) <= len(run_ids) // 10
        if settle_from is None and (few_left or time.monotonic() - started > args.faults_max_s):
            stop_faults.set()
            injector.join()
            for agent in agents:
                agent.signal(signal.SIGCONT)
            settle_from = time.monotonic()
            print(f"faults stopped after {settle_from - started:.0f}s; settling")
        if settle_from is not None and time.monotonic() - settle_from > args.settle_s:
            break
        for run_id in list(pending):
            try:
                run = http.get(f"/api/v1/runs/{run_id}").json()
            except httpx.HTTPError:  # the server is being restarted
                time.sleep(1)
                break
            if run["attempts"][-1]["state"] in ("succeeded", "failed", "terminated"):
                final[run_id] = run
                pending.discard(run_id)
        if pending:
            time.sleep(1)
    print(f"done after {time.monotonic() - started:.0f}s")
    lines = ledger.read_text().split("\n")
    starts = collections.Counter(line.split()[2] for line in lines if line.startswith("start "))
    ends_per_run = collections.Counter(line.split()[1] for line in lines if line.startswith("end "))
    attempts = [a for r in final.values() for a in r["attempts"]]
    reasons = collections.Counter(a["reason"] for a in attempts if a["reason"])
    succeeded = sum(1 for r in final.values() if r["attempts"][-1]["state"] == "succeeded")
    twice_started = [a for a, n in starts.items() if n > 1]
    twice_ended = [r for r, n in ends_per_run.items() if n > 1]
    ended_ids = {line.split()[2] for line in lines if line.startswith("end ")}
    stopped_midway = [a for a in starts if a not in ended_ids]
    beside = running_beside_retries(lines)
    nodes = service.list_nodes()
    from datetime import UTC, datetime

    offline = [n.name for n in nodes if not n.online(datetime.now(UTC), 4.0)]
    rows = [
        ("runs submitted", len(run_ids)),
        ("runs ended", len(final)),
        ("runs succeeded (last attempt)", succeeded),
        ("runs whose task the soak killed (may end failed)", len(killed_runs)),
        ("runs not ended (freezes)", len(pending)),
        ("attempts", len(attempts)),
        *[(f"attempts ended {reason}", n) for reason, n in sorted(reasons.items())],
        *[(f"faults: {kind}", n) for kind, n in sorted(faults.items())],
        ("attempts started twice", len(twice_started)),
        # a node cut off past the timeout may finish the task meanwhile; the server, not
        # hearing of it, retried it elsewhere (that is what the timeout is for)
        ("runs whose task also finished on a node cut off", len(twice_ended)),
        # what fencing is for: an attempt still running once its run's next attempt began
        ("attempts still running when their retry started", len(beside)),
        ("attempts stopped midway (lost, then stopped)", len(stopped_midway)),
        ("nodes offline at the end", ", ".join(offline) or 0),
    ]
    print(f"\n| soak ({args.database}, seed {args.seed}) | count |\n|---|---:|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    # what went wrong, run by run: a failure says itself in the log it leaves
    for run_id in run_ids:
        run = final.get(run_id)
        if run is not None and run["attempts"][-1]["state"] == "succeeded":
            continue
        if run is None:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                run = http.get(f"/api/v1/runs/{run_id}").json()
        said = [
            f"{a.get('state')} {a.get('reason') or ''} on {a.get('target')}: "
            f"{(a.get('message') or '')[:160]}"
            for a in (run or {}).get("attempts", [])
        ]
        killed = " (its task killed by the soak)" if run_id in killed_runs else ""
        print(f"{run_id}{' not ended' if run_id in pending else ''}{killed}:", file=sys.stderr)
        for line in said:
            print(f"  {line}", file=sys.stderr)
    for agent in agents:
        agent.signal(signal.SIGKILL)
    server.signal(signal.SIGKILL)
    service.close()
    if db_name:
        import psycopg

        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
    if not args.keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"kept {root}")
    unkilled = [r for r in run_ids if r not in killed_runs]
    whole = all(final[r]["attempts"][-1]["state"] == "succeeded" for r in unkilled if r in final)
    ok = not pending and whole and not twice_started and not beside
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
