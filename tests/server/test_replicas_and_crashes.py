"""The server's loops with nobody looking, under the two things a deployment does to them: two
replicas on one PostgreSQL store sharing the work, and a SIGKILL with 30 runs active (some of
them mid-launch) followed by a restart. Real `orbit server` processes, real tasks (local, and
on a real sshd on loopback); the only client calls after submitting are plain reads of the
store (GET /api/v1/runs/ID answers from the store in server mode: it never refreshes).

What is checked is what must never happen: a run that does not reach its true end, an attempt
launched twice (its `run.submitted` event, and the line its task appends to a shared file),
an attempt ended twice, a run that ran but is recorded as lost, a broken audit chain."""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from orbit import Client
from orbit.server.loops import LOOK_LEASE_S, Reconciler
from orbit.server.metrics import Metrics
from orbit.store import Store
from tests.helpers import eventually, orbit
from tests.orbit_server import Server
from tests.sshd import SYSTEM_PATH, SshdFactory
from tests.store.test_repository import make_run

TEXT: dict[str, Any] = {"capture_output": True, "text": True, "check": True}
TERMINAL = {"succeeded", "failed", "cancelled", "terminated"}
# the line each task appends to the shared file before anything else: its attempt's id
MARK = 'echo "$ORBIT_ATTEMPT_ID" >> "$MARK_FILE"'


@pytest.fixture(scope="module")
def server_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The servers' PATH, which their local tasks inherit: first a bare python3 (a venv
    without pip), for the precheck each attempt runs before its task. With pip it runs
    `pip freeze` (0.4 CPU-s an attempt, half of what these tests cost on 2 cores); without, it
    reads importlib.metadata. And no pyenv shim (seconds a precheck, under load)."""
    bare = tmp_path_factory.mktemp("bare-python")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], **TEXT)
    return {"PATH": f"{bare / 'bin'}{os.pathsep}{SYSTEM_PATH}"}


def spec(command: str, marks: Path, **fields: Any) -> dict[str, Any]:
    return {
        "experiment": "crash",
        "task_type": "command",
        "template": "local",
        "task": {"command": f"{MARK}; {command}", "env": {"MARK_FILE": str(marks)}},
        **fields,
    }


def submit(server: Server, data: dict[str, Any], base: Path) -> str:
    with Client(server.url, server.admin_token) as client:
        return str(client.submit(data, base_dir=base).record.id)


def read_run(http: httpx.Client, run_id: str) -> dict[str, Any]:
    """The run as the store has it: in server mode this read never looks at the run."""
    response = http.get(f"/api/v1/runs/{run_id}")
    response.raise_for_status()
    run = dict(response.json())
    run["state"] = run["attempts"][-1]["state"]  # a run's state is its current attempt's
    return run


def wait_all_terminal(
    http: httpx.Client, run_ids: list[str], timeout: float
) -> dict[str, dict[str, Any]]:
    """Poll the store (reads only: nobody asks for a look) until every run has ended; then,
    a few loop periods later, every run must still be as it ended: an ended run is final (no
    retry shows up after it was seen ended)."""
    found: dict[str, dict[str, Any]] = {}

    def ended() -> bool:
        for run_id in run_ids:
            if run_id not in found or found[run_id]["state"] not in TERMINAL:
                run = read_run(http, run_id)
                if run["state"] in TERMINAL:
                    found[run_id] = run
        return len(found) == len(run_ids)

    try:
        eventually(ended, timeout=timeout, every=0.25)
    except AssertionError:
        stuck = {r: read_run(http, r) for r in run_ids if r not in found}
        raise AssertionError(f"runs not ended after {timeout}s: {stuck}") from None
    time.sleep(2.5)
    for run_id, run in found.items():
        assert read_run(http, run_id) == run, f"{run_id} moved after it was seen ended"
    return found


def marks_of(path: Path) -> collections.Counter[str]:
    """How many times each attempt's task started."""
    text = path.read_text() if path.exists() else ""
    return collections.Counter(line for line in text.splitlines() if line)


def check_the_audit(
    http: httpx.Client, runs: dict[str, dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """Per attempt: one launch recorded if it has a handle, none if not; exactly one end. And
    the chain verifies. Returns each run's events."""
    every: dict[str, list[dict[str, Any]]] = {}
    for run_id, run in runs.items():
        events = http.get("/api/v1/audit", params={"run": run_id}).json()
        submitted = collections.Counter(
            e["attempt_id"] for e in events if e["action"] == "run.submitted"
        )
        ends = collections.Counter(
            e["attempt_id"]
            for e in events
            if e["action"] == "attempt.state" and e["data"]["to"] in TERMINAL
        )
        for attempt in run["attempts"]:
            aid = attempt["id"]
            assert submitted[aid] <= 1, f"{aid} launched {submitted[aid]} times: {events}"
            assert submitted[aid] == (attempt["handle"] is not None), (aid, attempt, events)
            assert ends[aid] == 1, f"{aid} ended {ends[aid]} times: {events}"
        assert set(submitted) <= {a["id"] for a in run["attempts"]}
        every[run_id] = events
    verified = http.get("/api/v1/audit/verify").json()
    assert verified["intact"] is True and verified["problems"] == [], verified
    return every


# --- two replicas on one PostgreSQL -----------------------------------------------------------


@pytest.mark.parametrize(
    "store_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_two_replicas_share_the_loops_and_never_launch_or_end_an_attempt_twice(
    start_server: Callable[..., Server],
    server_env: dict[str, str],
    store_url: str,
    tmp_path: Path,
) -> None:
    # Both replicas get the SAME ORBIT home: `local` runs execute on the machine that serves
    # them, so replicas on one machine must share its bundle cache and work dir (a replica
    # that adopts or ends another's local attempt looks for it in the work dir). Replicas on
    # different machines would run SSH placements only.
    first = start_server(env=server_env)
    second = start_server(env=server_env)
    replicas = [first, second]
    marks = tmp_path / "marks.txt"
    # quick retries: the loops start them after their backoff, nobody asking
    retry = {"max_retries": 2, "on_exit_codes": [3], "backoff_s": 0.2, "backoff_max_s": 0.5}
    plans: list[tuple[dict[str, Any], str]] = []
    for i in range(20):
        if i % 3 != 2:
            plans.append((spec(f"sleep 0.{i % 7}; echo ok {i}", marks), "succeeded"))
        else:
            # every other failing run retries at once (backoff 0): its retry is launched by
            # whichever replica's look ended the attempt before, in that same look
            policy = {**retry, "backoff_s": 0.0} if i % 6 == 2 else retry
            plans.append((spec(f"sleep 0.{i % 5}; exit 3", marks, retry=policy), "failed"))
    with ThreadPoolExecutor(max_workers=4) as pool:
        run_ids = list(
            pool.map(
                lambda item: submit(replicas[item[0] % 2], item[1][0], tmp_path),
                enumerate(plans),
            )
        )

    with first.client() as http:
        runs = wait_all_terminal(http, run_ids, timeout=45)
        for run_id, (_, expected) in zip(run_ids, plans, strict=True):
            run = runs[run_id]
            assert run["state"] == expected, run
            attempts = run["attempts"]
            if expected == "succeeded":
                assert len(attempts) == 1 and attempts[0]["exit_code"] == 0, run
            else:  # exactly max_retries + 1 attempts, each the task's own exit 3
                assert len(attempts) == 3, run
                assert [a["exit_code"] for a in attempts] == [3, 3, 3], run
                assert [a["reason"] for a in attempts] == ["task_exit_nonzero"] * 3, run
                assert [a["trigger"] for a in attempts] == ["submit", "auto_retry", "auto_retry"]
        check_the_audit(http, runs)

    # each attempt's task ran exactly once, on the host (and each was launched: it has a
    # handle, and so exactly one run.submitted event)
    attempts = [a for run in runs.values() for a in run["attempts"]]
    assert len(attempts) == 14 * 1 + 6 * 3 and all(a["handle"] for a in attempts)
    assert marks_of(marks) == collections.Counter(a["id"] for a in attempts)

    # both replicas did some of the looking: the lease of the look that ended an attempt
    # stays on it (reconcile_owner is `reconcile:HOST:PID`)
    import psycopg

    with psycopg.connect(store_url) as db:
        owners = collections.Counter(
            owner for (owner,) in db.execute("SELECT reconcile_owner FROM attempts")
        )
    pids = {str(first.proc.pid), str(second.proc.pid)}
    assert {str(o).rpartition(":")[2] for o in owners} == pids, owners


# --- kill -9 with 30 runs active, then a restart -----------------------------------------------


def list_run_ids(http: httpx.Client) -> list[str]:
    page = http.get("/api/v1/runs", params={"limit": 1000}).json()  # from the store, no looks
    return [view["run"]["id"] for view in page["runs"]]


def submit_quietly(server: Server, data: dict[str, Any], base: Path) -> str | None:
    """A submission whose server may die under it: the run may exist or not."""
    try:
        return submit(server, data, base)
    except Exception:  # the server was killed mid-request
        return None


def test_a_sigkill_with_30_runs_active_loses_no_run_and_runs_none_twice(
    start_server: Callable[..., Server],
    server_env: dict[str, str],
    sshd_factory: SshdFactory,
    tmp_path: Path,
) -> None:
    marks = tmp_path / "marks.txt"
    box = sshd_factory(alias="box")
    env = {**server_env, "ORBIT_SSH_CONFIG": str(sshd_factory.config), "ORBIT_SSH_TIMEOUT": "2"}
    # every run may retry what a crash did to it, quickly (infrastructure failures qualify)
    retry = {"max_retries": 2, "backoff_s": 0.5, "backoff_max_s": 1.0}
    dead: list[tuple[float, float]] = []  # when no server was up

    # 1. a server that dies right after it started an attempt, before the store recorded it
    first = start_server(env={**env, "ORBIT_FAILPOINTS": "after-launch"})
    orbit(first.env(), "hosts", "add", "box", "--ssh", box.alias, "--work-dir", str(box.work_root))
    prelude = spec("sleep 4; echo prelude", marks, retry=retry)
    assert submit_quietly(first, prelude, tmp_path) is None
    first.proc.wait(timeout=15)  # reaped (as a supervisor would): its pid is known gone
    assert first.proc.returncode == -signal.SIGKILL

    # 2. the next one adopts that attempt; 25 more runs, 3 of them on the SSH host, sleeping
    # 2 to 11 s; SIGKILL as soon as they are all submitted, its loops in the middle of a pass
    second = start_server(env=env)
    overrides = {"target": "box", "resources": {"gpu_count": 0}}
    ssh = {"template": "targon-rental-host", "overrides": overrides}
    # (the SSH ones first: their staging takes longest)
    plans = [spec(f"sleep {3 + 2 * i}; echo ssh", marks, retry=retry, **ssh) for i in range(3)]
    plans += [spec(f"sleep {2 + i % 10}; echo local", marks, retry=retry) for i in range(22)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        submitted = list(pool.map(lambda data: submit(second, data, tmp_path), plans))
    second.stop(signal.SIGKILL)
    killed_at = time.time()

    # 3. a server whose launches are held: 4 runs submitted together, and SIGKILL while all
    # 4 are held, claimed but not started
    third = start_server(env={**env, "ORBIT_FAILPOINTS": "before-launch=sleep:10"})
    dead.append((killed_at, time.time()))
    held = ThreadPoolExecutor(max_workers=4)
    pending = [
        held.submit(submit_quietly, third, spec(f"echo held {i}", marks, retry=retry), tmp_path)
        for i in range(4)
    ]
    with third.client() as http:

        def all_held() -> bool:  # all 30 runs exist, and 4 of them are being launched
            page = http.get("/api/v1/runs", params={"limit": 1000}).json()
            states = [view["run"]["attempts"][-1]["state"] for view in page["runs"]]
            return len(states) == 30 and states.count("prepared") == 4

        eventually(all_held, timeout=20, every=0.05)
    third.stop(signal.SIGKILL)
    killed_at = time.time()
    held.shutdown(wait=True)
    assert [f.result() for f in pending] == [None] * 4  # their clients saw the server go
    time.sleep(2)  # dead for a while: more tasks end meanwhile, with nobody to see it

    # 4. a restart on the same store and home; with nobody looking, every run gets to its end
    fourth = start_server(env=env)
    dead.append((killed_at, time.time()))
    with fourth.client() as http:
        run_ids = list_run_ids(http)
        assert len(run_ids) == 30 and set(submitted) <= set(run_ids)
        runs = wait_all_terminal(http, run_ids, timeout=45)
        events = check_the_audit(http, runs)
    verified = orbit(fourth.env(), "audit", "verify")  # the chain verifies after the crashes
    assert verified.returncode == 0, verified.stdout

    # no attempt ran twice, and every run ran once: the task of one attempt of each
    ran = marks_of(marks)
    assert max(ran.values()) == 1, f"attempts executed twice: {ran}"
    assert sum(ran.values()) == len(runs)
    attempts = [a for run in runs.values() for a in run["attempts"]]
    for run in runs.values():  # every task exits 0: every run ends succeeded
        assert run["state"] == "succeeded" and run["attempts"][-1]["exit_code"] == 0, run
    for attempt in attempts:
        if ran[attempt["id"]]:  # it ran: it succeeded, whenever the crashes fell
            assert attempt["state"] == "succeeded" and attempt["exit_code"] == 0, attempt
        else:  # it never started: an infrastructure failure, which its policy retried
            assert attempt["state"] == "failed", attempt
            assert attempt["reason"] in ("staging_failed", "runtime_lost"), attempt

    def command(run: dict[str, Any]) -> str:
        return str(run["submission"]["task_request"]["command"])

    # started, unrecorded when its server died: adopted by the next, and not run again
    [adopted] = [r for r in runs.values() if command(r).endswith("echo prelude")]
    assert len(adopted["attempts"]) == 1, adopted
    [launch] = [e for e in events[adopted["id"]] if e["action"] == "run.submitted"]
    assert launch["data"]["adopted_from"] == f"{socket.gethostname()}:{first.proc.pid}"
    # claimed, never started when its server died: ended staging_failed, retried, run once
    held_runs = [r for r in runs.values() if " held " in command(r)]
    assert len(held_runs) == 4
    for run in held_runs:
        never = run["attempts"][0]
        assert never["reason"] == "staging_failed", run
        assert "stopped before it started" in never["message"], run
        assert [a["state"] for a in run["attempts"]] == ["failed", "succeeded"], run

    # tasks ended while no server was up, and were seen to have succeeded afterwards; others
    # ended after the restart (the held runs' retries, at least)
    def finished(attempt: dict[str, Any]) -> float:
        return datetime.fromisoformat(attempt["finished_at"]).timestamp()

    ran_attempts = [a for a in attempts if ran[a["id"]]]
    assert any(t0 < finished(a) < t1 for a in ran_attempts for t0, t1 in dead), (dead, attempts)
    assert any(finished(a) > dead[-1][1] for a in ran_attempts), (dead, attempts)


def test_the_reconcile_leases_of_a_gone_process_of_this_host_are_released_at_once(
    store: Store, tmp_path: Path
) -> None:
    """A server killed mid-look leaves the attempts it was looking at leased for LOOK_LEASE_S;
    the next one to start on this host (or a replica beside it) releases them at its first
    pass instead of waiting that out. A live process's leases, and another host's, stand."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], **TEXT)
    host = socket.gethostname()
    dead = f"reconcile:{host}:{int(gone.stdout)}"
    alive = f"reconcile:{host}:{os.getppid()}"
    elsewhere = f"reconcile:{host}-b:{int(gone.stdout)}"
    experiment = store.experiments.create_experiment("exp", "tester")
    runs = [make_run(store, experiment.id) for _ in range(3)]
    at = datetime.now(UTC)
    lease = at + timedelta(seconds=LOOK_LEASE_S)
    for owner in (dead, alive, elsewhere):
        assert len(store.leases.claim_reconcile(owner, at=at, lease_until=lease, limit=1)) == 1
    reconciler = Reconciler(
        SimpleNamespace(store=store),  # type: ignore[arg-type]
        Metrics(store),
        every_s=1.0,
        workers=1,
    )
    assert reconciler.release_the_gone() == [dead]
    assert store.leases.reconcile_holders(datetime.now(UTC)) == sorted([alive, elsewhere])
    assert (
        len(store.leases.claim_reconcile("next", at=datetime.now(UTC), lease_until=lease, limit=9))
        == 1
    )
    assert reconciler.release_the_gone() == [] and len(runs) == 3
