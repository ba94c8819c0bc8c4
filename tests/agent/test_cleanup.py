"""A node's work dir cleans itself, as an admin sees it: real `orbit server` and `orbit agent`
processes on loopback, the real CLI. An attempt's folder goes once it ended and every file of
it is on the control plane (`--clean-after` later, or at once while the work dir is short of
room, `--min-free`); never one that runs, never one with files still held on the node, never
the bundle a running attempt was made from. Collect is then served from the server's copy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from orbit.model.templates import builtin_dir
from tests.agents import AgentProc, wait_online
from tests.helpers import eventually, orbit, orbit_json
from tests.orbit_server import Server
from tests.server.test_storage import CHECKPOINTS, WAIT_FOR, run_of, state_of, submit, uploaded


def folder(agent: AgentProc, server: Server, run_id: str) -> Path:
    return agent.work_dir / "attempts" / run_of(server, run_id)["attempts"][-1]["id"]


def test_an_uploaded_attempt_goes_after_clean_after_and_a_running_one_stays(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    agent = start_agent(orbit_server, "gpu-a", extra=["--clean-after", "2s"])
    wait_online(orbit_server, "gpu-a")
    flag = tmp_path / "go"
    running = submit(orbit_server, tmp_path, "echo up" + WAIT_FOR.format(flag=flag))
    done = submit(orbit_server, tmp_path, CHECKPOINTS.format(tag="done"))
    uploaded(orbit_server, done)
    eventually(lambda: state_of(orbit_server, running) == "running", 30)
    ended_here = folder(agent, orbit_server, done)
    eventually(lambda: not ended_here.exists(), timeout=30)
    assert not (agent.work_dir / "attempts" / f"{ended_here.name}.json").exists()
    # the run is whole on the control plane: collect needs nothing of the node
    collected = orbit_json(orbit_server.env(), "collect", done, "--dest", str(tmp_path / "out"))
    assert collected["verified"] is True and (tmp_path / "out" / "weights.bin").is_file()
    # the running attempt's folder stays however long it runs
    assert folder(agent, orbit_server, running).is_dir()
    flag.touch()
    uploaded(orbit_server, running)
    eventually(lambda: not folder(agent, orbit_server, running).exists(), timeout=30)


def test_short_of_room_uploaded_folders_and_unused_bundles_go_at_once(
    orbit_server: Server, start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    # checkpoints held on the node until a collect asks (placement.upload_large: false)
    templates = orbit_server.home / "templates"
    templates.mkdir(exist_ok=True)
    text = (builtin_dir() / "pool.yaml").read_text()
    held = text.replace("id: pool", "id: pool-held").replace(
        "upload_large: true", "upload_large: false"
    )
    (templates / "pool-held.yaml").write_text(held)
    # less than 100% free is always short of room: whatever may go, goes at once
    agent = start_agent(
        orbit_server, "gpu-a", max_tasks=3, extra=["--clean-after", "30d", "--min-free", "100%"]
    )
    wait_online(orbit_server, "gpu-a")
    flag = tmp_path / "go"
    running = submit(orbit_server, tmp_path, "echo up" + WAIT_FOR.format(flag=flag))
    eventually(lambda: state_of(orbit_server, running) == "running", 30)
    spec = tmp_path / "held.yaml"
    spec.write_text(
        "experiment: exp\ntask_type: command\ntemplate: pool-held\n"
        f"task: {{command: '{CHECKPOINTS.format(tag='held')}'}}\n"
    )
    kept = str(orbit_json(orbit_server.env(), "submit", str(spec))["id"])
    eventually(lambda: state_of(orbit_server, kept) == "succeeded", 30)
    held_here = folder(agent, orbit_server, kept)
    # a run that ends after it: its folder goes at once (so the cleaner has looked since)
    other = "echo other; head -c 100000 /dev/urandom > $ORBIT_ARTIFACTS_DIR/w"
    done = submit(orbit_server, tmp_path, other)
    uploaded(orbit_server, done)
    eventually(lambda: not folder(agent, orbit_server, done).exists(), timeout=30)
    # the bundle of the ended run goes; the running one's stays
    digests = {r: run_of(orbit_server, r)["bundle_digest"] for r in (running, done)}
    eventually(lambda: not (agent.work_dir / "bundles" / digests[done]).exists(), timeout=30)
    assert (agent.work_dir / "bundles" / digests[running]).is_dir()
    assert folder(agent, orbit_server, running).is_dir()
    # an attempt whose checkpoints are still only on the node is never removed ...
    assert (held_here / "artifacts" / "checkpoints" / "checkpoint-3" / "model.bin").is_file()
    # ... until a collect brought them to the control plane: then it goes
    out = tmp_path / "held-out"
    collected = orbit_json(orbit_server.env(), "collect", kept, "--dest", str(out))
    assert collected["verified"] is True and (out / "checkpoints" / "checkpoint-3").is_dir()
    eventually(lambda: not held_here.exists(), timeout=30)
    flag.touch()
    uploaded(orbit_server, running)
    eventually(lambda: not folder(agent, orbit_server, running).exists(), timeout=30)


def test_bad_cleanup_options_are_refused_in_one_line(tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    for option, value, said in (
        ("--min-free", "150%", "--min-free: expected a percentage"),
        ("--clean-after", "soon", "--clean-after: expected a duration"),
    ):
        proc = orbit(
            env,
            "agent",
            "--server",
            "http://127.0.0.1:9",
            "--work-dir",
            str(tmp_path / "w"),
            option,
            value,
            check=False,
        )
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
