"""Sweeps as a team meets them: real `orbit server` and `orbit agent` processes on loopback, the
real CLI, SQLite and PostgreSQL. One `orbit submit --sweep` makes a group of runs, one per point,
whose values reach the task in its placeholders and as ORBIT_SWEEP_<KEY>; the inputs are sent and
stored once; a group is read, ranked by a metric, cancelled and retried as one; a sweep that is
refused writes nothing; a restricted experiment's groups are not there for a non-member."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orbit import Client
from orbit.model.errors import NotFound
from tests.agents import AgentProc, wait_online
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server
from tests.server.test_server import token_for

# each point says what it was given, logs its loss (its seed), and the seed 2 fails
TASK = (
    "echo lr={lr} seed=$ORBIT_SWEEP_SEED tag=$TAG data=$(cat data.txt); "
    "mkdir -p $ORBIT_ARTIFACTS_DIR; "
    'echo \'{"step": 5, "loss": {seed}}\' > $ORBIT_ARTIFACTS_DIR/logging.jsonl; '
    "test {seed} != 2"
)


def sweep_spec(folder: Path, command: str = TASK, **fields: Any) -> Path:
    work = folder / "wd"
    work.mkdir(exist_ok=True)
    (work / "data.txt").write_text("payload\n")
    task = {"command": command, "workdir": "wd", "env": {"TAG": "t-{lr}"}}
    return write_spec(folder, template="pool", task=task, **fields)


def ended(env: dict[str, str], group: str) -> dict[str, Any] | None:
    shown = orbit_json(env, "groups", "show", group)["group"]
    terminal = {"succeeded", "failed", "terminated"}
    return shown if set(shown["counts"]) <= terminal else None


def test_a_sweep_makes_a_group_of_runs_that_is_read_ranked_retried_and_cancelled_as_one(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    start_agent(orbit_server, "gpu-a", max_tasks=4)
    wait_online(orbit_server, "gpu-a")
    env = orbit_server.env()
    spec = sweep_spec(tmp_path)
    made = orbit_json(env, "submit", str(spec), "--sweep", "lr=0.1,0.3", "--sweep", "seed=0..2")
    group = made["id"]
    assert made["size"] == 6 and made["sweep"]["grid"] == {
        "lr": ["0.1", "0.3"],
        "seed": ["0", "1", "2"],
    }
    shown = eventually(lambda: ended(env, group), timeout=90, every=0.5)
    assert shown["counts"] == {"succeeded": 4, "failed": 2}

    # each run is a normal run, its point recorded, its values in its args and env
    runs = orbit_json(env, "runs", "list", "--group", group)
    assert len(runs) == 6 and {r["group"] for r in runs} == {group}
    points = {r["id"]: r["submission"]["point"] for r in runs}
    assert sorted((p["lr"], p["seed"]) for p in points.values()) == [
        (lr, seed) for lr in ("0.1", "0.3") for seed in ("0", "1", "2")
    ]
    for run, point in points.items():
        logs = orbit(env, "logs", run).stdout
        lr, seed = point["lr"], point["seed"]
        assert f"lr={lr} seed={seed} tag=t-{lr} data=payload" in logs, logs
    failed = orbit_json(env, "runs", "list", "--group", group, "--state", "failed")
    assert {points[r["id"]]["seed"] for r in failed} == {"2"}

    # the inputs were sent once and are stored once: every bundle links the same file
    bundles = orbit_server.home / "bundles"
    digests = {r["bundle"]["digest"] for r in runs}
    assert len(digests) == 6
    inodes = {os.stat(bundles / d / "inputs" / "workdir" / "data.txt").st_ino for d in digests}
    assert len(inodes) == 1

    # ranked by the metric the tasks log: the lowest loss first, the highest last
    view = orbit_json(env, "groups", "show", group, "--metric", "loss")
    assert [s["value"] for s in view["best"]] == [0.0, 0.0, 1.0]
    assert [s["value"] for s in view["worst"]] == [2.0, 2.0, 1.0]
    assert view["best"][0]["step"] == 5 and view["unscored"] == 0
    said = orbit(env, "groups", "show", group, "--metric", "loss").stdout
    assert "best by loss (lowest first)" in said and "lr=0.1 seed=0" in said
    listed = orbit(env, "groups", "list").stdout
    assert group in listed and "4 succeeded, 2 failed" in listed

    # its failed runs, again, as one; they fail again the same way
    again = orbit_json(env, "retry", "--group", group, "--failed", "--yes")
    assert again["counts"] == {"retried": 2}
    assert {i["run"] for i in again["items"]} == {r["id"] for r in failed}
    shown = eventually(lambda: ended(env, group), timeout=60, every=0.5)
    assert shown["counts"] == {"succeeded": 4, "failed": 2}
    assert {len(r["attempts"]) for r in failed} == {1}  # listed before the retry
    retried = orbit_json(env, "runs", "list", "--group", group, "--state", "failed")
    assert {len(r["attempts"]) for r in retried} == {2}

    # a sweep of long runs, cancelled as one (by a prefix of its id)
    sleeper = write_spec(tmp_path, "sleep.yaml", template="pool", task={"command": "sleep {s}"})
    second = orbit_json(env, "submit", str(sleeper), "--sweep", "s=120,121")["id"]
    eventually(
        lambda: orbit_json(env, "groups", "show", second)["group"]["counts"] == {"running": 2}
    )
    stopped = orbit_json(env, "cancel", "--group", second[:8], "--yes")
    assert stopped["counts"] == {"cancelled": 2}
    done = eventually(lambda: ended(env, second), timeout=60, every=0.5)
    assert done["counts"] == {"terminated": 2}

    # orbit.Client: the same, from Python
    with Client(orbit_server.url, orbit_server.admin_token) as client:
        made_py = client.sweep(spec, ["lr=0.5", "seed=0,1"])
        assert made_py.size == 2
        assert {r.id for r in client.runs(group=made_py.id)} == set(client.group(made_py.id).runs)
        assert [g.id for g in client.groups(limit=3)] == [made_py.id, second, group]


def test_a_sweep_that_is_refused_writes_nothing(orbit_server: Server, tmp_path: Path) -> None:
    env = orbit_server.env()
    spec = sweep_spec(tmp_path)
    cases = [
        (["--sweep", "lr=", "--sweep", "seed=1"], "--sweep lr: expected one value or more"),
        (["--sweep", "lr=1", "--sweep", "seed=0...2"], "--sweep seed: malformed range '0...2'"),
        (["--sweep", "lr=1"], "task.command: placeholder {seed} is filled by no sweep key"),
        (
            ["--sweep", "lr=1", "--sweep", "seed=1", "--sweep", "x=1,2"],
            "sweep key 'x' fills nothing: write {x} where its value goes",
        ),
        (
            ["--sweep", "lr=0..100", "--sweep", "seed=0..99"],
            "sweep: more than 10,000 points (the most one sweep may make; a server's "
            "limits.sweep_points",
        ),
        # its values are env too: what looks like a secret is refused as in env
        (
            ["--sweep", "lr=1", "--sweep", "seed=ghp_0123456789abcdefghijABCDEFGHIJ012345"],
            "env.ORBIT_SWEEP_SEED: the value looks like",
        ),
    ]
    for args, said in cases:
        refused = orbit(env, "submit", str(spec), *args, check=False)
        assert refused.returncode == 2, (args, refused.stderr)
        assert said in refused.stderr and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert orbit_json(env, "groups", "list") == []
    assert orbit_json(env, "runs", "list") == []
    assert not any((orbit_server.home / "bundles").glob("*/job.json"))


def test_a_restricted_experiments_groups_are_not_there_for_a_non_member(
    members_here: Server, tmp_path: Path
) -> None:
    server = members_here
    admin = server.env()
    mia = server.env(token_for(server, "mia", "member"))
    ann_token = token_for(server, "ann", "member")
    ann = server.env(ann_token)
    orbit(admin, "experiments", "create", "secret-x")
    orbit(admin, "experiments", "restrict", "secret-x", "--member", "mia")
    spec = write_spec(tmp_path, experiment="secret-x", task={"command": "echo {n}"})
    group = orbit_json(mia, "submit", str(spec), "--sweep", "n=1,2")["id"]
    assert group in {g["id"] for g in orbit_json(mia, "groups", "list")}
    assert orbit_json(ann, "groups", "list") == []
    refused = orbit(ann, "groups", "show", group, check=False)
    assert refused.returncode != 0 and f"unknown group '{group}'" in refused.stderr
    refused = orbit(ann, "runs", "list", "--group", group, check=False)
    assert refused.returncode != 0 and f"unknown group '{group}'" in refused.stderr
    refused = orbit(ann, "submit", str(spec), "--sweep", "n=3", check=False)
    assert "experiment: 'secret-x' is restricted to its members" in refused.stderr
    with Client(server.url, ann_token) as client:
        try:
            client.group(group)
        except NotFound:
            pass
        else:
            raise AssertionError("a non-member read a restricted experiment's group")
