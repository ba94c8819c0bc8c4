"""Preemption with resume, against a real server and real agents: a batch training run (the
example's loop, checkpointing every 50 steps) is pushed off its node by an urgent run, goes
on on another node from its checkpoint, and ends where an unbroken run ends."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.agent.test_gpus import H100
from tests.agent.test_pool_runs import ended
from tests.agents import AgentProc, nvml_env, wait_online
from tests.helpers import eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-train" / "train.py"
STEPS = ["--steps", "300", "--sleep", "0.03", "--save-every", "50"]


def unbroken(tmp_path: Path) -> str:
    """The last line of the same training run by hand, never stopped."""
    out = tmp_path / "unbroken"
    env = {**os.environ, "ORBIT_ARTIFACTS_DIR": str(out)}
    env.pop("ORBIT_RESUME_FROM", None)
    args = [sys.executable, str(EXAMPLE), *STEPS[:2], "--sleep", "0"]
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def logs(server: Server, run_id: str, attempt: int) -> str:
    return orbit(server.env(), "logs", run_id, "--attempt", str(attempt)).stdout


def test_an_urgent_run_preempts_batch_training_which_resumes_from_its_checkpoint(
    start_server: Callable[..., Server], start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    config = tmp_path / "scheduler.yaml"
    config.write_text("preemption: {enabled: true, cooldown_s: 0}\n", encoding="utf-8")
    server = start_server(env={"ORBIT_SCHEDULER_CONFIG": str(config)})
    start_agent(server, "gpu", max_tasks=1, env=nvml_env(H100))
    start_agent(server, "cpu", max_tasks=1)
    wait_online(server, "gpu", "cpu")
    folder = tmp_path / "train"
    folder.mkdir()
    shutil.copy(EXAMPLE, folder / "train.py")
    batch_spec = write_spec(
        folder,
        name="batch.yaml",
        template="pool",
        task_type="python",
        task={"script": "train.py", "args": STEPS},
        priority="batch",
        preemptible=True,
        overrides={"resources": {"any_of": [{"gpu": "H100"}, {"gpu": "none"}]}},
    )
    batch = str(orbit_json(server.env(), "submit", str(batch_spec))["id"])
    eventually(lambda: "step 100:" in logs(server, batch, 1), 120, every=0.5)
    urgent_spec = write_spec(
        folder,
        name="urgent.yaml",
        template="pool",
        task={"command": "echo urgent; sleep 5"},
        priority="urgent",
        overrides={"resources": {"gpu": "H100"}},
    )
    urgent = str(orbit_json(server.env(), "submit", str(urgent_spec))["id"])
    assert ended(server, urgent, timeout=120)["attempts"][-1]["state"] == "succeeded"
    done = ended(server, batch, timeout=180)
    first, second = done["attempts"][0], done["attempts"][-1]
    assert (first["state"], first["reason"]) == ("terminated", "preempted"), first
    assert second["state"] == "succeeded" and len(done["attempts"]) == 2, done["attempts"]
    # pushed off the GPU node, it went on on the CPU node: its checkpoint came from the
    # control plane's copy, not from a folder it had
    where = [a["handle"]["target"] for a in (first, second)]
    assert where == ["gpu", "cpu"], done["attempts"]
    resumed = logs(server, batch, 2)
    found = re.search(r"resumed from step (\d+)", resumed)
    assert found is not None, resumed
    step = int(found.group(1))
    assert step >= 100 and step % 50 == 0
    assert f"step {step}:" not in resumed and "step 300:" in resumed  # on from there
    assert resumed.strip().splitlines()[-1] == unbroken(tmp_path)
    # the urgent run's decision names the attempt it stopped; explain renders it
    events = orbit_json(server.env(), "audit", "--run", batch)
    assert any(e["action"] == "attempt.preempted" for e in events), events
