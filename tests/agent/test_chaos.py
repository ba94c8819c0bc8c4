"""The randomized fault test: bench/soak.py at a size CI affords. Real `orbit server` and three
`orbit agent`s; while pool runs go through, faults at random: agents killed and restarted or
frozen, wrappers and tasks killed, nodes revoked and joined again, the server killed and
restarted. Every run must reach its true end (all succeed but those whose task was killed), no
attempt may start twice, and none may still run once its retry has begun (the soak's exit
status says all three; its table is printed). A new seed every time, printed: a failure is
replayed with `bench/soak.py --seed N --runs N`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNS = int(os.environ.get("ORBIT_CHAOS_RUNS", "60"))


@pytest.mark.parametrize(
    "database", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_every_run_converges_under_random_faults(database: str) -> None:
    seed = int(time.time() * 1000) % 100_000
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    argv = [sys.executable, str(ROOT / "bench" / "soak.py"), "--runs", str(RUNS)]
    argv += ["--seed", str(seed), "--database", database, "--settle-s", "150"]
    argv += ["--fault-every-s", "0.5", "2", "--faults-max-s", "300"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    print(f"seed {seed}\n{done.stdout}\n{done.stderr[-3000:]}")
    assert done.returncode == 0, f"seed {seed}:\n{done.stdout}\n{done.stderr[-3000:]}"
    assert "| attempts still running when their retry started | 0 |" in done.stdout
