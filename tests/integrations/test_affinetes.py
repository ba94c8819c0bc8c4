"""`task_type: affinetes` through the CLI as a process: an upstream-shaped git repository made
here (environments/NAME/env.py with an actor whose async evaluate() scores a task), pinned to
a commit, staged as it is and run as a black box; what is refused at submit; a task's failure
and timeout counted while the others go on; upstream's results kept unmodified beside the thin
manifest; an upstream file changed by the task failing the run; a cancel stopping it all.

The environments here do not call a model: the endpoint's URL and the model's name reach
evaluate() and come back in its result. test_affinetes_model.py runs one against a real
OpenAI-compatible server (ms-swift's `swift deploy` of a tiny model on the CPU)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.agents import AgentProc, wait_online
from tests.helpers import eventually, orbit, orbit_json, sqlite_env, write_spec
from tests.orbit_server import Server

ARITH = '''
import asyncio


class ArithActor:
    """Scores task N as N / 10; task 3 raises, task 4 never answers in time."""

    def __init__(self, scale=10):
        self.scale = scale

    async def evaluate(self, model, base_url, task_id, seed=0, api_key=None):
        if task_id == 3:
            raise ValueError("task 3 has no answer")
        if task_id == 4:
            await asyncio.sleep(60)
        await asyncio.sleep(0.05)
        return {"task_id": task_id, "score": task_id / self.scale, "model": model,
                "base_url": base_url, "seed": seed, "extra": {"upstream": "own payload"}}
'''

MUTATE = """
import os


class MutateActor:
    async def evaluate(self, model, base_url, task_id):
        with open(os.path.join(os.path.dirname(__file__), "cache.txt"), "a") as f:
            f.write(str(task_id))
        return {"score": 1.0}
"""

SLEEPY = """
import asyncio


class SleepyActor:
    async def evaluate(self, **kwargs):
        await asyncio.sleep(120)
"""

STEPPER = '''
class StepperActor:
    """An interactive environment: reset, step, state (a coroutine or not), and evaluate."""

    def __init__(self):
        self.position = None

    async def reset(self, start=0):
        self.position = start
        return {"position": self.position}

    async def step(self, by):
        if by < 0:
            raise ValueError("cannot step back")
        self.position += by
        return {"position": self.position, "done": self.position >= 10}

    def state(self):
        return {"position": self.position}

    async def evaluate(self, task_id):
        return {"score": 0.0}
'''

CONTROLLER = """
import json
import os
import socket

with socket.socket(socket.AF_UNIX) as s:
    s.connect(os.environ["ORBIT_AFFINETES_SOCKET"])
    answers = s.makefile("r")

    def call(method, **args):
        s.sendall((json.dumps({"id": method, "method": method, "args": args}) + "\\n").encode())
        return json.loads(answers.readline())

    print("methods", call("orbit.methods")["result"])
    print("reset", call("reset", start=2)["result"])
    for by in (3, 4):
        print("step", call("step", by=by)["result"])
    print("back", call("step", by=-1)["error"])
    print("fly", call("fly")["error"])
    print("state", call("state")["result"])
"""

GUESS = """
from shared.scoring import perfect  # the repository's own package, as affinetes.core is


class GuessActor:
    async def evaluate(self, task_id, model, base_url, api_key=None):
        return {"score": perfect(), "api_key": api_key}


Actor = GuessActor  # the name upstream's framework looks for
"""

DEPS = """
import six


class Actor:
    async def evaluate(self, task_id):
        return {"score": 1.0, "six": six.__version__}
"""

SPIN = """
class Actor:
    async def evaluate(self, task_id):
        while task_id == 2:  # synchronous code that never awaits: no timeout can cancel it
            pass
        return {"score": 1.0}
"""

TWO = """
class One:
    async def evaluate(self, task_id): ...


class Two:
    async def evaluate(self, task_id): ...
"""


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t"}
    env.update(GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, check=True)
    return done.stdout.decode().strip()


@pytest.fixture
def upstream(tmp_path: Path) -> tuple[Path, str]:
    """An affinetes-shaped repository and its commit."""
    repo = tmp_path / "affinetes"
    environments = {"ARITH": ARITH, "MUTATE": MUTATE, "SLEEPY": SLEEPY, "STEPPER": STEPPER}
    environments.update({"TWO": TWO, "game/GUESS": GUESS, "DEPS": DEPS, "SPIN": SPIN})
    for name, text in environments.items():
        (repo / "environments" / name).mkdir(parents=True)
        (repo / "environments" / name / "env.py").write_text(text)
    (repo / "environments" / "DEPS" / "requirements.txt").write_text("six==1.16.0\n")
    (repo / "shared").mkdir()
    (repo / "shared" / "__init__.py").write_text("")
    (repo / "shared" / "scoring.py").write_text("def perfect():\n    return 1.0\n")
    (repo / "README.md").write_text("# affinetes (shaped)\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "environments")
    return repo, git(repo, "rev-parse", "HEAD")


def spec(tmp_path: Path, pinned: tuple[Path, str], name: str = "spec.yaml", **task: Any) -> Path:
    repo, commit = pinned
    fields = {
        "upstream": {"repo": str(repo), "commit": commit},
        "environment": "ARITH",
        "tasks": [1, 2, 3, 4, 5, 6],
        "model": "my-org/my-model",
        "endpoint": {"base_url": "http://127.0.0.1:9/v1"},
        "concurrency": 2,
        "timeout_s": 3,
        "evaluate_args": {"seed": 7},
        **task,
    }
    return write_spec(tmp_path, name, task_type="affinetes", task=fields)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return sqlite_env(tmp_path / "home", tmp_path / "orbit.db")


def attempt_dir(env: dict[str, str], run_id: str) -> Path:
    run = orbit_json(env, "runs", "show", run_id)
    return Path(run["attempts"][-1]["handle"]["location"])


def test_a_pinned_environment_runs_as_a_black_box_and_counts_its_failures(
    env: dict[str, str], tmp_path: Path, upstream: tuple[Path, str]
) -> None:
    check_black_box(env, tmp_path, upstream)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_the_same_through_a_server(
    orbit_server: Server, tmp_path: Path, upstream: tuple[Path, str]
) -> None:
    """The client stages the upstream and checks the environment; the server shapes the task
    again and freezes what the client gathered."""
    check_black_box(orbit_server.env(), tmp_path, upstream)


def check_black_box(env: dict[str, str], tmp_path: Path, upstream: tuple[Path, str]) -> None:
    run = orbit_json(env, "submit", str(spec(tmp_path, upstream)))
    followed = orbit(env, "logs", run["id"], "--follow", check=False)
    assert followed.returncode == 1  # some tasks failed: the run says so, after all of them
    assert "2 of 6 tasks failed (1 failed, 1 timed out)" in followed.stdout
    assert "task 3: failed, ValueError: task 3 has no answer" in followed.stdout
    folder = attempt_dir(env, run["id"])
    artifacts = folder / "artifacts"
    results = {
        r["task_id"]: r
        for r in map(json.loads, (artifacts / "raw" / "results.jsonl").read_text().splitlines())
    }
    assert sorted(results) == [1, 2, 3, 4, 5, 6]
    assert {k: r["status"] for k, r in results.items()} == {
        1: "ok",
        2: "ok",
        3: "failed",
        4: "timed_out",
        5: "ok",
        6: "ok",
    }
    # upstream's payload as evaluate() returned it: our model, URL and task id, its own seed
    assert results[5]["result"] == {
        "task_id": 5,
        "score": 0.5,
        "model": "my-org/my-model",
        "base_url": "http://127.0.0.1:9/v1",
        "seed": 7,
        "extra": {"upstream": "own payload"},
    }
    assert results[4]["error"] == "no result within 3 s"
    manifest = json.loads((artifacts / "manifests" / "affinetes_swe_blackbox_run.json").read_text())
    repo, commit = upstream
    assert manifest["schema_version"] == "affinetes_swe_blackbox_run.v1"
    assert manifest["upstream"]["commit"] == commit
    assert manifest["upstream"]["tree"] == git(repo, "rev-parse", "HEAD^{tree}")
    assert manifest["upstream"]["tree_checked"] is True
    assert manifest["upstream"]["changed_during_run"] == []
    assert (manifest["environment"], manifest["actor"], manifest["method"]) == (
        "ARITH",
        "ArithActor",
        "evaluate",
    )
    assert manifest["task_ids"] == [1, 2, 3, 4, 5, 6]
    assert manifest["counts"] == {"ok": 4, "failed": 1, "timed_out": 1, "not_run": 0, "total": 6}
    assert manifest["score"]["mean"] == pytest.approx((0.1 + 0.2 + 0.5 + 0.6) / 4)
    assert manifest["orbit"]["run_id"] == run["id"]
    assert manifest["orbit"]["bundle_digest"] == run["bundle"]["digest"]
    assert "payload" not in json.dumps(manifest)  # thin: nothing of upstream's results
    listed = json.loads((artifacts / "manifest.json").read_text())["files"]
    assert "manifests/affinetes_swe_blackbox_run.json" in {f["path"] for f in listed}
    status = orbit_json(env, "status", run["id"])
    assert status["progress"]["step"] == 6 and status["progress"]["max_steps"] == 6
    assert status["progress"]["failed"] == 2
    assert status["progress"]["score"] == pytest.approx(manifest["score"]["mean"])
    assert "step 6/6, mean score 0.35, 2 failed" in orbit(env, "status", run["id"]).stdout
    # the upstream staged as committed; nothing of it written by the run (no bytecode)
    staged = folder / "inputs" / "upstream"
    assert (staged / "environments" / "ARITH" / "env.py").read_text() == ARITH
    assert not list(staged.rglob("__pycache__"))


def test_what_is_refused_at_submit_in_one_line(
    env: dict[str, str], tmp_path: Path, upstream: tuple[Path, str]
) -> None:
    repo, commit = upstream

    def refused(name: str, **task: Any) -> str:
        done = orbit(env, "submit", str(spec(tmp_path, upstream, name, **task)), check=False)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip().count("\n") == 0, done.stderr
        return done.stderr

    short = {"repo": str(repo), "commit": commit[:12]}
    assert "task.upstream.commit: expected the exact 40-character" in refused("a", upstream=short)
    unknown = {"repo": str(repo), "commit": "0" * 40}
    assert "task.upstream.commit: commit 0000000000" in refused("b", upstream=unknown)
    said = refused("c", environment="NOPE")
    assert "task.environment:" in said and "has no environments/NOPE/env.py" in said
    assert "(it has: ARITH, DEPS, MUTATE, SLEEPY, SPIN, STEPPER, TWO, game/GUESS)" in said
    assert "task.actor: environments/ARITH/env.py has no class Other" in refused("d", actor="Other")
    assert "several classes with an evaluate() (One, Two): name the actor" in refused(
        "e", environment="TWO"
    )
    elsewhere = {"base_url": "http://10.0.0.1:8000/v1"}
    assert "task.endpoint.base_url: the model server must run on the node" in refused(
        "f", endpoint=elsewhere
    )
    said = refused("h", endpoint={"service": "vllm"})  # no node here advertises model servers
    assert "task.endpoint.service: only agent-pool nodes advertise model servers" in said
    # a dirty upstream is never staged, --allow-dirty or not
    (repo / "environments" / "ARITH" / "env.py").write_text(ARITH + "# patched\n")
    for extra in ((), ("--allow-dirty",)):
        done = orbit(env, "submit", str(spec(tmp_path, upstream, "g")), *extra, check=False)
        assert done.returncode == 2, done.stderr
        assert "task.upstream.repo:" in done.stderr and "uncommitted changes" in done.stderr
        assert "an upstream runs exactly as committed" in done.stderr
    assert orbit_json(env, "runs", "list") == []  # nothing was created


def test_an_upstream_file_changed_during_the_run_fails_it(
    env: dict[str, str], tmp_path: Path, upstream: tuple[Path, str]
) -> None:
    task = {"environment": "MUTATE", "tasks": {"range": [0, 3]}, "evaluate_args": {}}
    run = orbit_json(env, "submit", str(spec(tmp_path, upstream, **task)))
    followed = orbit(env, "logs", run["id"], "--follow", check=False)
    assert followed.returncode == 1
    said = "the upstream's files changed during the run: environments/MUTATE/cache.txt"
    assert said in followed.stdout
    artifacts = attempt_dir(env, run["id"]) / "artifacts"
    manifest = json.loads((artifacts / "manifests" / "affinetes_swe_blackbox_run.json").read_text())
    assert manifest["upstream"]["changed_during_run"] == ["environments/MUTATE/cache.txt"]
    assert orbit_json(env, "status", run["id"])["attempts"][-1]["exit_code"] == 3


def test_a_cancel_stops_the_tasks_and_keeps_the_manifest(
    env: dict[str, str], tmp_path: Path, upstream: tuple[Path, str]
) -> None:
    task = {"environment": "SLEEPY", "tasks": {"range": [0, 4]}, "timeout_s": 600}
    run = orbit_json(env, "submit", str(spec(tmp_path, upstream, **task)))
    eventually(lambda: "4 tasks" in orbit(env, "logs", run["id"]).stdout, timeout=60)
    orbit(env, "cancel", run["id"])
    eventually(lambda: orbit_json(env, "status", run["id"])["state"] == "terminated", timeout=60)
    artifacts = attempt_dir(env, run["id"]) / "artifacts"
    manifest = json.loads((artifacts / "manifests" / "affinetes_swe_blackbox_run.json").read_text())
    assert manifest["cancelled"] is True
    assert manifest["counts"] == {"ok": 0, "failed": 0, "timed_out": 0, "not_run": 4, "total": 4}


def test_a_staged_tree_that_is_not_the_commit_runs_nothing(
    tmp_path: Path, upstream: tuple[Path, str]
) -> None:
    """The launcher by hand, in a folder laid out as a bundle's inputs/: its upstream is the
    commit's files but one, so the tree id differs from the one recorded at freezing."""
    import shutil
    import sys

    from orbit.integrations.affinetes_swe import task as plugin

    repo, commit = upstream
    inputs = tmp_path / "inputs"
    shutil.copytree(repo, inputs / "upstream", ignore=shutil.ignore_patterns(".git"))
    (inputs / ".orbit").mkdir()
    record = {
        "upstream": "task.upstream",
        "commit": commit,
        "tree": git(repo, "rev-parse", "HEAD^{tree}"),
    }
    (inputs / ".orbit" / "provenance.json").write_text(json.dumps({"sources": [record]}))
    workdir = inputs / "workdir"
    workdir.mkdir()
    shutil.copy(plugin.LAUNCHER, workdir / "orbit_affinetes.py")
    shutil.copy(plugin.GIT_TREE, workdir / "orbit_git_tree.py")
    shutil.copy(plugin.BRIDGE, workdir / "orbit_affinetes_bridge.py")
    shutil.copy(plugin.PYENV, workdir / "orbit_affinetes_env.py")
    shutil.copy(plugin.EVALUATING, workdir / "orbit_affinetes_evaluate.py")
    settings = {
        "upstream_dir": "../upstream",
        "environment": "ARITH",
        "actor": None,
        "tasks": [1],
        "model": "m",
        "endpoint": {"base_url": "http://127.0.0.1:9/v1", "service": None, "path": "/v1"},
        "api_key_env": None,
        "concurrency": 1,
        "timeout_s": 5,
        "evaluate_args": {},
        "actor_args": {},
        "mode": "evaluate",
    }
    env = {
        "PATH": os.environ["PATH"],
        "ORBIT_AFFINETES": json.dumps(settings),
        "ORBIT_INPUTS_DIR": str(inputs),
        "ORBIT_ARTIFACTS_DIR": str(tmp_path / "artifacts"),
    }

    def launch() -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-S", "orbit_affinetes.py"]  # -S: the standard library only
        return subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True)

    assert launch().returncode == 0  # as committed: it runs
    (inputs / "upstream" / "README.md").write_text("# changed after freezing\n")
    done = launch()
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"the staged upstream is not commit {commit}" in done.stdout
    results = (tmp_path / "artifacts" / "raw" / "results.jsonl").read_text().splitlines()
    assert len(results) == 1  # the first launch's one task; the second ran nothing


def test_a_bridge_serves_the_environments_methods_to_a_controller_and_logs_every_call(
    env: dict[str, str], tmp_path: Path, upstream: tuple[Path, str]
) -> None:
    (tmp_path / "drive.py").write_text(CONTROLLER)
    task = {"environment": "STEPPER", "mode": "bridge", "controller": "drive.py", "tasks": None}
    run = orbit_json(env, "submit", str(spec(tmp_path, upstream, **task)))
    followed = orbit(env, "logs", run["id"], "--follow", check=False)
    assert followed.returncode == 0, followed.stdout + followed.stderr
    said = followed.stdout
    assert "methods ['evaluate', 'reset', 'state', 'step']" in said
    assert "reset {'position': 2}" in said and "step {'position': 9, 'done': False}" in said
    assert "back ValueError: cannot step back" in said
    assert "fly no method 'fly' (there are: evaluate, reset, state, step)" in said
    assert "state {'position': 9}" in said
    artifacts = attempt_dir(env, run["id"]) / "artifacts"
    raw = (artifacts / "raw" / "bridge_events.jsonl").read_text()
    events = [json.loads(line) for line in raw.splitlines()]
    assert [e["method"] for e in events] == [
        "orbit.methods",
        "reset",
        "step",
        "step",
        "step",
        "fly",
        "state",
    ]
    assert events[2]["args"] == {"by": 3}
    assert events[2]["answer"]["result"] == {"position": 5, "done": False}
    manifest = json.loads((artifacts / "manifests" / "affinetes_swe_blackbox_run.json").read_text())
    assert manifest["method"] == "bridge" and manifest["counts"] == {"calls": 7, "errors": 2}
    assert manifest["raw"] == ["raw/bridge_events.jsonl"]
    assert not list(attempt_dir(env, run["id"]).rglob("affinetes.sock"))  # gone with the run


def test_upstreams_own_actor_name_a_nested_environment_and_its_package(
    env: dict[str, str], tmp_path: Path, upstream: tuple[Path, str]
) -> None:
    """As upstream's SWE-INFINITE (`Actor = InfiniteActor`) and game/number_guess (nested,
    importing affinetes.core from the repository's root)."""
    task = {"environment": "game/GUESS", "tasks": [1, 2], "evaluate_args": {}}
    run = orbit_json(env, "submit", str(spec(tmp_path, upstream, **task)))
    assert orbit(env, "logs", run["id"], "--follow").returncode == 0
    artifacts = attempt_dir(env, run["id"]) / "artifacts"
    results = [
        json.loads(line) for line in (artifacts / "raw" / "results.jsonl").read_text().splitlines()
    ]
    assert [r["result"] for r in results] == [{"score": 1.0, "api_key": "EMPTY"}] * 2
    manifest = json.loads((artifacts / "manifests" / "affinetes_swe_blackbox_run.json").read_text())
    assert manifest["actor"] == "GuessActor" and manifest["environment"] == "game/GUESS"


def test_an_environments_requirements_go_into_a_per_commit_environment_made_once(
    env: dict[str, str], tmp_path: Path, upstream: tuple[Path, str]
) -> None:
    cache = tmp_path / "cache"
    env = {**env, "ORBIT_AFFINETES_CACHE": str(cache)}  # the node's cache (a local run's env)
    task = {"environment": "DEPS", "tasks": [1], "evaluate_args": {}, "timeout_s": 60}
    said = []
    for name in ("first.yaml", "second.yaml"):
        run = orbit_json(env, "submit", str(spec(tmp_path, upstream, name, **task)))
        followed = orbit(env, "logs", run["id"], "--follow", timeout=300)
        said.append(followed.stdout)
    commit = upstream[1]
    made = [m for m in cache.glob(f"{commit[:12]}-*") if m.is_dir()]  # not its .lock
    assert len(made) == 1, made
    assert f"making the environment {made[0]}" in said[0] and "reusing" not in said[0]
    assert f"reusing the environment {made[0]}" in said[1] and "making" not in said[1]
    artifacts = attempt_dir(env, run["id"]) / "artifacts"
    results = (artifacts / "raw" / "results.jsonl").read_text()
    assert json.loads(results)["result"] == {"score": 1.0, "six": "1.16.0"}
    assert "six==1.16.0" in (artifacts / "raw" / "python_env.txt").read_text()
    precheck = json.loads((artifacts / "raw" / "python_env-precheck.json").read_text())
    assert precheck["python"]["executable"].startswith(str(made[0]))  # the environment's own
    assert "six==1.16.0" in (artifacts / "raw" / "python_env-precheck.log").read_text()
    manifest = json.loads((artifacts / "manifests" / "affinetes_swe_blackbox_run.json").read_text())
    assert manifest["python_env"]["path"] == str(made[0])
    assert manifest["python_env"]["commit"] == commit


def test_an_upstream_named_by_url_is_mirrored_once_and_fetched_for_a_new_commit(
    env: dict[str, str], tmp_path: Path, upstream: tuple[Path, str]
) -> None:
    repo, first = upstream
    url = f"file://{repo}"
    task = {"upstream": {"repo": url, "commit": first}, "tasks": [5], "evaluate_args": {}}
    run = orbit_json(env, "submit", str(spec(tmp_path, upstream, "one.yaml", **task)))
    assert orbit(env, "logs", run["id"], "--follow").returncode == 0
    manifest_path = attempt_dir(env, run["id"]) / "artifacts" / "manifests"
    manifest = json.loads((manifest_path / "affinetes_swe_blackbox_run.json").read_text())
    assert manifest["upstream"]["repo"] == url and manifest["upstream"]["commit"] == first
    mirrors = list((Path(env["ORBIT_HOME"]) / "upstreams").glob("*.git"))
    assert len(mirrors) == 1
    # a commit made upstream since: the mirror fetches it
    (repo / "README.md").write_text("# affinetes, later\n")
    git(repo, "commit", "-qam", "later")
    later = git(repo, "rev-parse", "HEAD")
    task["upstream"] = {"repo": url, "commit": later}
    run = orbit_json(env, "submit", str(spec(tmp_path, upstream, "two.yaml", **task)))
    assert orbit(env, "logs", run["id"], "--follow").returncode == 0
    assert list((Path(env["ORBIT_HOME"]) / "upstreams").glob("*.git")) == mirrors
    # one that cannot be had: one line, the URL's secret never shown
    task["upstream"] = {"repo": "https://orbit:s3cret@127.0.0.1:9/affinetes.git", "commit": later}
    done = orbit(env, "submit", str(spec(tmp_path, upstream, "three.yaml", **task)), check=False)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
    assert "task.upstream.repo: git clone https://127.0.0.1:9/affinetes.git failed" in done.stderr
    assert "s3cret" not in done.stderr


def test_a_task_stuck_in_synchronous_code_is_timed_out_and_the_run_ends(
    env: dict[str, str], tmp_path: Path, upstream: tuple[Path, str]
) -> None:
    task = {"environment": "SPIN", "tasks": [1, 2, 3], "concurrency": 1, "timeout_s": 1}
    run = orbit_json(env, "submit", str(spec(tmp_path, upstream, **{**task, "evaluate_args": {}})))
    followed = orbit(env, "logs", run["id"], "--follow", check=False, timeout=120)
    assert followed.returncode == 1
    assert "task 2: timed_out, stuck in synchronous code" in followed.stdout
    artifacts = attempt_dir(env, run["id"]) / "artifacts"
    results = [
        json.loads(line) for line in (artifacts / "raw" / "results.jsonl").read_text().splitlines()
    ]
    assert [(r["task_id"], r["status"]) for r in results] == [(1, "ok"), (2, "timed_out")]
    assert "synchronous code" in results[1]["error"] and results[1]["seconds"] >= 11
    manifest = json.loads((artifacts / "manifests" / "affinetes_swe_blackbox_run.json").read_text())
    assert manifest["counts"] == {"ok": 1, "failed": 0, "timed_out": 1, "not_run": 1, "total": 3}


def test_an_endpoint_by_service_goes_to_the_node_that_advertises_it(
    orbit_server: Server,
    start_agent: Callable[..., AgentProc],
    tmp_path: Path,
    upstream: tuple[Path, str],
) -> None:
    """On an agent pool: placed on the node advertising the model server, its URL given to
    evaluate() (the service's URL and the endpoint's path); one nobody advertises refused."""
    start_agent(orbit_server, "plain", max_tasks=2)
    start_agent(orbit_server, "served", max_tasks=2, extra=["--service", "vllm=http://127.0.0.1:9"])
    wait_online(orbit_server, "plain", "served")
    env = orbit_server.env()
    task = {"endpoint": {"service": "vllm"}, "tasks": [1, 2], "timeout_s": 30}
    path = spec(tmp_path, upstream, "pool.yaml", **task)
    pool = path.read_text().replace("template: local", "template: pool")
    path.write_text(pool)
    run = orbit_json(env, "submit", str(path))
    followed = orbit(env, "logs", run["id"], "--follow", timeout=120)
    assert "2 tasks done, mean score 0.15" in followed.stdout
    status = orbit_json(env, "status", run["id"])
    assert status["attempts"][-1]["handle"]["target"] == "served"
    dest = tmp_path / "collected"
    orbit(env, "collect", run["id"], "--dest", str(dest))
    results = [
        json.loads(line) for line in (dest / "raw" / "results.jsonl").read_text().splitlines()
    ]
    assert {r["result"]["base_url"] for r in results} == {"http://127.0.0.1:9/v1"}
    manifest = json.loads((dest / "manifests" / "affinetes_swe_blackbox_run.json").read_text())
    assert manifest["endpoint"]["service"] == "vllm"
    elsewhere = tmp_path / "nobody.yaml"
    elsewhere.write_text(pool.replace("service: vllm", "service: sglang"))
    refused = orbit(env, "submit", str(elsewhere), check=False)
    assert refused.returncode == 2 and refused.stderr.startswith(
        "orbit: error: task.endpoint.service: no registered node advertises sglang"
    ), refused.stderr
