"""Storage with a lifecycle, as users see it: real `orbit server` and `orbit agent` processes on
loopback, the real CLI, SQLite and PostgreSQL. The server keeps one copy of each attempt's
files and serves collect from it; a second collect of unchanged artifacts moves nothing, and
one cut short goes on from where it stopped; retention and gc remove bytes on the server and
the node, never what a running attempt needs; usage says the bytes that are on disk."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from orbit.core.execution.mirror import read_agent_state
from tests.agents import AgentProc, wait_online
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server
from tests.proxy import CuttingProxy
from tests.sshd import SshdFactory

# three checkpoints (checkpoint-1..3, 200 kB each) and 3 MB of weights
CHECKPOINTS = (
    "cd $ORBIT_ARTIFACTS_DIR; for i in 1 2 3; do mkdir -p checkpoints/checkpoint-$i; "
    "head -c 200000 /dev/urandom > checkpoints/checkpoint-$i/model.bin; done; "
    "head -c 3000000 /dev/urandom > weights.bin; echo {tag}"
)
WAIT_FOR = "; while [ ! -e {flag} ]; do sleep 0.1; done"


def submit(server: Server, folder: Path, command: str, experiment: str = "exp") -> str:
    spec = write_spec(
        folder,
        name=f"spec-{time.monotonic_ns()}.yaml",
        experiment=experiment,
        template="pool",
        task={"command": command},
    )
    return str(orbit_json(server.env(), "submit", str(spec))["id"])


def run_of(server: Server, run_id: str) -> dict[str, Any]:
    with server.client() as http:
        return dict(http.get(f"/api/v1/runs/{run_id}").json())


def state_of(server: Server, run_id: str) -> str:
    return str(run_of(server, run_id)["attempts"][-1]["state"])


def uploaded(server: Server, run_id: str, timeout: float = 60) -> dict[str, Any]:
    """The run, once it ended and every file of it is in the server's copy."""

    def check() -> dict[str, Any] | None:
        run = run_of(server, run_id)
        last = run["attempts"][-1]
        copy = server.home / "artifacts" / last["id"]
        done = last["state"] in ("succeeded", "failed", "terminated")
        return run if done and read_agent_state(copy).get("complete") else None

    return eventually(check, timeout=timeout, every=0.1)


def disk_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.fixture
def storage_server(start_server: Callable[..., Server], tmp_path: Path) -> Callable[..., Server]:
    def start(storage: dict[str, Any]) -> Server:
        config = tmp_path / "server.yaml"
        config.write_text(yaml.safe_dump({"storage": storage}))
        return start_server("--config", str(config))

    return start


# --- collect: one copy, incremental, resumable -------------------------------------------------


@pytest.fixture
def proxy(orbit_server: Server) -> Iterator[CuttingProxy]:
    found = CuttingProxy(orbit_server.url, cut_after=1_500_000)
    yield found
    found.close()


def test_collect_is_served_from_the_one_copy_moves_nothing_twice_and_goes_on_after_a_cut(
    orbit_server: Server,
    start_agent: Callable[..., AgentProc],
    proxy: CuttingProxy,
    tmp_path: Path,
) -> None:
    start_agent(orbit_server, "gpu-a")
    wait_online(orbit_server, "gpu-a")
    run_id = submit(orbit_server, tmp_path, CHECKPOINTS.format(tag="one"))
    run = uploaded(orbit_server, run_id)
    copy = orbit_server.home / "artifacts" / run["attempts"][-1]["id"] / "artifacts"
    total = disk_bytes(copy)
    env = orbit_server.env()
    # a transfer cut part way: what arrived stays, the command says how to go on
    dest = tmp_path / "out"
    cut = orbit(
        orbit_server.env(ORBIT_SERVER=proxy.url),
        "collect",
        run_id,
        "--dest",
        str(dest),
        check=False,
    )
    assert cut.returncode == 3, cut.stderr
    assert "was cut after" in cut.stderr and "run the same collect again" in cut.stderr
    assert len(cut.stderr.strip().splitlines()) == 1
    partial = dest / ".orbit-collect" / "partial" / "weights.bin"
    assert 0 < partial.stat().st_size < 3_000_000  # the file it was writing, so far
    arrived = disk_bytes(dest) - disk_bytes(dest / ".orbit-collect" / "digests.json")
    # run again: only the rest moves, and everything is verified
    again = orbit_json(env, "collect", run_id, "--dest", str(dest))
    assert again["verified"] is True, again
    assert again["bytes"] == total and again["files"] == sum(
        1 for p in copy.rglob("*") if p.is_file()
    )
    assert again["moved"] == total - arrived
    assert not partial.exists()
    assert (dest / "weights.bin").read_bytes() == (copy / "weights.bin").read_bytes()
    # a second collect of unchanged artifacts moves 0 bytes, and says so
    second = orbit(env, "collect", run_id, "--dest", str(dest)).stdout
    assert f"{total} bytes (0 moved)" in second, second
    # another destination gets all of it, from the same copy: the server keeps no second one
    fresh = orbit_json(env, "collect", run_id, "--dest", str(tmp_path / "fresh"))
    assert fresh["moved"] == total and fresh["verified"] is True
    assert not (orbit_server.home / "collected").exists()
    assert not list(orbit_server.home.glob(".collect-*"))
    # a file changed at the destination is sent again, and only it
    (dest / "weights.bin").write_bytes(b"changed")
    third = orbit_json(env, "collect", run_id, "--dest", str(dest))
    assert third["moved"] == (copy / "weights.bin").stat().st_size and third["verified"]


# --- retention: the server's loop -----------------------------------------------------------


def test_retention_removes_bytes_on_server_and_node_and_leaves_pinned_and_running_runs(
    storage_server: Callable[..., Server], start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    server = storage_server(
        {
            "gc_every_s": 1,
            "retention": {
                "keep_checkpoints": 1,
                "experiments": {"short": {"artifacts_days": 0.00005}},  # ~4 s
            },
        }
    )
    agent = start_agent(server, "gpu-a", max_tasks=4)
    wait_online(server, "gpu-a")
    env = server.env()
    flag = tmp_path / "go"
    running = submit(
        server, tmp_path, CHECKPOINTS.format(tag="r") + WAIT_FOR.format(flag=flag), "short"
    )
    # pinned while it runs: a gc pass (every second) must not see it ended and unpinned
    pin_flag = tmp_path / "pinned"
    pinned = submit(
        server, tmp_path, CHECKPOINTS.format(tag="p") + WAIT_FOR.format(flag=pin_flag), "short"
    )
    orbit(env, "runs", "pin", pinned)
    pin_flag.touch()
    expiring = submit(server, tmp_path, CHECKPOINTS.format(tag="e"), "short")
    trimmed = submit(server, tmp_path, CHECKPOINTS.format(tag="t"), "long")
    attempts = {
        name: uploaded(server, run_id)["attempts"][-1]["id"]
        for name, run_id in (("pinned", pinned), ("expiring", expiring), ("trimmed", trimmed))
    }
    eventually(lambda: state_of(server, running) == "running", 30)
    attempts["running"] = run_of(server, running)["attempts"][-1]["id"]

    def copy(name: str) -> Path:
        return server.home / "artifacts" / attempts[name] / "artifacts"

    def on_node(name: str) -> Path:
        return agent.work_dir / "attempts" / attempts[name]

    # the expired run: gone from the server and from the node, its record kept
    assert (on_node("expiring") / "artifacts" / "weights.bin").is_file()
    eventually(lambda: not copy("expiring").parent.exists(), timeout=30)
    eventually(lambda: not on_node("expiring").exists(), timeout=30)
    refused = orbit(env, "collect", expiring, "--dest", str(tmp_path / "x"), check=False)
    assert refused.returncode == 2 and "removed by retention" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    shown = orbit_json(env, "runs", "show", expiring)
    assert shown["storage"]["expired_at"] and shown["state"] == "succeeded"
    events = [e["action"] for e in orbit_json(env, "audit", "--run", expiring)]
    assert "run.expired" in events
    # the other experiment keeps its runs but only the newest checkpoint
    eventually(lambda: not (copy("trimmed") / "checkpoints" / "checkpoint-2").exists(), 30)
    assert not (copy("trimmed") / "checkpoints" / "checkpoint-1").exists()
    assert (copy("trimmed") / "checkpoints" / "checkpoint-3" / "model.bin").is_file()
    collected = orbit_json(env, "collect", trimmed, "--dest", str(tmp_path / "t"))
    assert collected["verified"] is True, collected
    assert [r.split(":")[0] for r in collected["removed"]] == [
        "checkpoints/checkpoint-1",
        "checkpoints/checkpoint-2",
    ]
    assert "removed by retention (keep_checkpoints)" in collected["removed"][0]
    # pinned: nothing of it touched, though it ended long enough ago
    assert len(list((copy("pinned") / "checkpoints").iterdir())) == 3
    assert (copy("pinned") / "weights.bin").is_file()
    # running: its files stay, and deleting it is refused in one line, removing nothing
    assert len(list((copy("running") / "checkpoints").iterdir())) == 3
    assert (on_node("running") / "artifacts" / "weights.bin").is_file()
    refused = orbit(env, "runs", "delete", running, check=False)
    assert refused.returncode == 2, refused.stderr
    assert "is running" in refused.stderr and "nothing was deleted" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert (copy("running") / "weights.bin").is_file()
    flag.touch()
    uploaded(server, running)


# --- runs delete, gc, usage -------------------------------------------------------------------


def usage_on_disk(server: Server, run_ids: list[str]) -> dict[str, int]:
    """Bytes of these runs' attempts' copies and bundles (with their archives), summed."""
    found = {"artifacts": 0, "bundles": 0}
    digests = set()
    for run_id in run_ids:
        run = run_of(server, run_id)
        digests.add(run["bundle_digest"])
        for attempt in run["attempts"]:
            found["artifacts"] += disk_bytes(server.home / "artifacts" / attempt["id"])
    for digest in digests:
        found["bundles"] += disk_bytes(server.home / "bundles" / digest)
        archive = server.home / "bundle-archives" / f"{digest}.tar"
        found["bundles"] += disk_bytes(archive) if archive.exists() else 0
    return found


def test_delete_gc_and_usage_match_the_bytes_on_disk(
    storage_server: Callable[..., Server], start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    server = storage_server({"gc_every_s": 0})
    agent = start_agent(server, "gpu-a", max_tasks=4)
    wait_online(server, "gpu-a")
    env = server.env()
    same = CHECKPOINTS.format(tag="same")
    first, second = submit(server, tmp_path, same, "a"), submit(server, tmp_path, same, "a")
    other = submit(server, tmp_path, CHECKPOINTS.format(tag="other"), "b")
    runs = {run_id: uploaded(server, run_id) for run_id in (first, second, other)}
    assert runs[first]["bundle_digest"] == runs[second]["bundle_digest"]
    digest = runs[first]["bundle_digest"]

    # usage: per user and experiment, as on disk (the shared bundle counts once)
    found = orbit_json(env, "usage")
    wanted = usage_on_disk(server, [first, second, other])
    admin = next(u for u in found["users"] if u["name"] == "admin")
    assert (admin["artifacts_bytes"], admin["bundles_bytes"]) == (
        wanted["artifacts"],
        wanted["bundles"],
    )
    by_experiment = {e["name"]: e for e in found["experiments"]}
    a = usage_on_disk(server, [first, second])
    assert by_experiment["a"]["artifacts_bytes"] == a["artifacts"]
    assert by_experiment["a"]["bundles_bytes"] == a["bundles"] and by_experiment["a"]["runs"] == 2
    # the same figures in the API and /metrics
    with server.client() as http:
        assert http.get("/api/v1/usage").json()["users"] == found["users"]
        metrics = http.get("/metrics").text
    gauges = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
    }
    key = ("orbit_storage_user_bytes", (("kind", "artifacts"), ("user", "admin")))
    assert gauges[key] == wanted["artifacts"]
    key = ("orbit_storage_experiment_bytes", (("experiment", "a"), ("kind", "bundles")))
    assert gauges[key] == a["bundles"]

    # delete one run of the shared bundle: its copies go (server, node); the bundle stays
    attempt = runs[first]["attempts"][-1]["id"]
    assert (agent.work_dir / "attempts" / attempt).is_dir()
    held = disk_bytes(server.home / "artifacts" / attempt)
    deleted = orbit_json(env, "runs", "delete", first)
    assert {(r["kind"], r["where"]) for r in deleted["removals"]} == {
        ("attempt", "server"),
        ("attempt", "node gpu-a"),
    }
    assert deleted["bytes"] == held
    assert any("still used by run" in k for k in deleted["kept"])
    assert not (server.home / "artifacts" / attempt).exists()
    eventually(lambda: not (agent.work_dir / "attempts" / attempt).exists(), timeout=30)
    assert (server.home / "bundles" / digest).is_dir()
    shown = orbit_json(env, "runs", "show", first)
    assert shown["storage"]["deleted_by"] == "admin"
    assert "run.deleted" in [e["action"] for e in orbit_json(env, "audit", "--run", first)]
    # the last run of it: the bundle goes too (its folder and the archive agents fetched)
    assert (server.home / "bundle-archives" / f"{digest}.tar").is_file()
    orbit(env, "runs", "delete", second)
    assert not (server.home / "bundles" / digest).exists()
    assert not (server.home / "bundle-archives" / f"{digest}.tar").exists()
    after = orbit_json(env, "usage")
    assert {e["name"]: e["total_bytes"] for e in after["experiments"]}["a"] == 0
    assert after["artifacts_bytes"] == usage_on_disk(server, [other])["artifacts"]

    # gc: what no record refers to (an old collect cache, a folder of no attempt) goes
    stray = server.home / "artifacts" / "att-stray"
    stray.mkdir()
    (stray / "left.bin").write_bytes(b"x" * 1000)
    (server.home / "collected" / "run-old" / "1").mkdir(parents=True)
    (server.home / "collected" / "run-old" / "1" / "w.bin").write_bytes(b"y" * 500)
    old = time.time() - 7200
    os.utime(stray, (old, old))
    dry = orbit_json(env, "gc", "--dry-run")
    assert dry["dry_run"] is True and dry["bytes"] == 1500
    assert stray.exists()
    done = orbit(env, "gc").stdout
    assert "removed 2 on the server (1.5 KB)" in done, done
    assert not stray.exists() and not (server.home / "collected").exists()
    # what the other run has is untouched, and gc is for admins only
    assert (server.home / "artifacts" / runs[other]["attempts"][-1]["id"]).is_dir()
    token = orbit_json(env, "tokens", "create", "--user", _member(env))["token"]
    refused = orbit(server.env(token), "gc", check=False)
    assert refused.returncode == 2 and "permission storage.gc" in refused.stderr


def _member(env: dict[str, str]) -> str:
    orbit(env, "users", "add", "mia", "--role", "member")
    return "mia"


def test_a_member_deletes_and_pins_only_their_own_runs(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    start_agent(orbit_server, "gpu-a")
    wait_online(orbit_server, "gpu-a")
    env = orbit_server.env()
    run_id = submit(orbit_server, tmp_path, "echo mine")
    uploaded(orbit_server, run_id)
    orbit(env, "users", "add", "eve", "--role", "member")
    eve = orbit_server.env(orbit_json(env, "tokens", "create", "--user", "eve")["token"])
    for args in (("runs", "delete", run_id), ("runs", "pin", run_id)):
        refused = orbit(eve, *args, check=False)
        assert refused.returncode == 2 and "anyone's runs" in refused.stderr, refused.stderr
    assert json.loads(orbit(env, "runs", "pin", run_id, "--json").stdout)["pinned"] is True


def test_an_ssh_hosts_artifacts_are_brought_once_into_the_servers_copy_and_served_from_it(
    start_server: Callable[..., Server], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    box = sshd_factory(alias="box")
    server = start_server(env={"ORBIT_SSH_CONFIG": str(sshd_factory.config)})
    env = server.env()
    orbit(env, "hosts", "add", "box", "--ssh", box.alias, "--work-dir", str(box.work_root))
    spec = write_spec(
        tmp_path, template="targon-rental-host", task={"command": CHECKPOINTS.format(tag="s")}
    )
    sets = ("--set", "target=box", "--set", "resources.gpu_count=0")
    run = orbit_json(env, "submit", str(spec), *sets, "--wait")
    assert run["state"] == "succeeded", run
    attempt = run["attempts"][-1]["id"]
    dest = tmp_path / "out"
    first = orbit_json(env, "collect", run["id"], "--dest", str(dest))
    assert first["verified"] is True and first["moved"] == first["bytes"] > 3_000_000
    # the server's one copy of it, which the next collects are served from
    copy = server.home / "artifacts" / attempt / "artifacts"
    assert disk_bytes(copy) == first["bytes"] and not (server.home / "collected").exists()
    again = orbit_json(env, "collect", run["id"], "--dest", str(dest))
    assert again["moved"] == 0 and again["verified"] is True
    exp = {e["name"]: e for e in orbit_json(env, "usage")["experiments"]}["exp"]
    assert exp["artifacts_bytes"] == disk_bytes(server.home / "artifacts" / attempt)
    orbit(env, "runs", "delete", run["id"])
    assert not (server.home / "artifacts" / attempt).exists()
