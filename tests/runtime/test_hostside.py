"""The host-side process sweep with real processes: what it stops, and what it never touches."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

from orbit.runtime import hostside
from tests.helpers import eventually, process_alive

PLANE = "plane-test"


def marked(attempts: Path, attempt_id: str, script: str) -> subprocess.Popen[bytes]:
    folder = attempts / attempt_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.json").write_text(json.dumps({"stop_grace_s": 1.5}))
    env = {**os.environ, "ORBIT_ATTEMPT_ID": attempt_id, "ORBIT_PLANE": PLANE}
    return subprocess.Popen(["bash", "-c", script], env=env, start_new_session=True)


def test_a_sweep_never_stops_an_attempt_launched_while_it_waits(tmp_path: Path) -> None:
    attempts = tmp_path / "attempts"
    # an ended attempt's leftover that ignores SIGTERM: the sweep waits out the grace period
    old = marked(attempts, "run-old-1", "trap '' TERM; while :; do sleep 0.1; done")
    time.sleep(0.3)  # its trap is set
    result: dict[str, object] = {}
    sweep = threading.Thread(
        target=lambda: result.update(hostside.stop_ended(str(attempts), [], PLANE))
    )
    sweep.start()
    time.sleep(0.5)  # the sweep has listed the ended attempt and sent SIGTERM
    new = marked(attempts, "run-new-1", "sleep 30")  # launched meanwhile: not ended
    sweep.join(timeout=30)
    try:
        assert not sweep.is_alive()
        eventually(lambda: not process_alive(old.pid), timeout=10)
        assert process_alive(new.pid)
        assert set(result["stopped"]) == {"run-old-1"}  # type: ignore[arg-type]
    finally:
        for proc in (old, new):
            proc.kill()
            proc.wait()


def test_a_sweep_stops_only_processes_with_this_planes_marks(tmp_path: Path) -> None:
    attempts = tmp_path / "attempts"
    ended = marked(attempts, "run-ended-1", "sleep 30")
    live = marked(attempts, "run-live-1", "sleep 30")
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        result = hostside.stop_ended(str(attempts), ["run-live-1"], PLANE)
        assert set(result["stopped"]) == {"run-ended-1"}
        eventually(lambda: not process_alive(ended.pid), timeout=10)
        assert process_alive(live.pid) and process_alive(stranger.pid)
    finally:
        for proc in (ended, live, stranger):
            proc.kill()
            proc.wait()
