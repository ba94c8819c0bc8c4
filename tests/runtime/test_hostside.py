"""ORBIT's side of a host: the process sweep with real processes (what it stops, and what it
never touches), the staged bundles' verified copies, and hostside as one program over SSH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from orbit.runtime import host_processes, host_staging
from tests.helpers import eventually, process_alive

PLANE = "plane-test"


def marked(attempts: Path, attempt_id: str, script: str) -> subprocess.Popen[bytes]:
    folder = attempts / attempt_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.json").write_text(json.dumps({"stop_grace_s": 1.5}))
    env = {**os.environ, "ORBIT_ATTEMPT_ID": attempt_id, "ORBIT_PLANE": PLANE}
    return subprocess.Popen(["bash", "-c", script], env=env, start_new_session=True)


def settled(*procs: subprocess.Popen[bytes]) -> None:
    """Until each `bash -c 'sleep 30'` has become its sleep. Popen returns once the child's
    execve has begun, and until an execve has set up the new program (bash's, then bash's own
    of sleep) /proc/PID/environ reads empty: a sweep in that instant does not see the process
    (on CI's loaded machine one did, and stopped nothing; the next sweep would have)."""

    def slept(proc: subprocess.Popen[bytes]) -> bool:
        try:
            return Path(f"/proc/{proc.pid}/comm").read_text().strip() == "sleep"
        except OSError:
            return False

    eventually(lambda: all(slept(p) for p in procs), timeout=10)


def test_a_sweep_never_stops_an_attempt_launched_while_it_waits(tmp_path: Path) -> None:
    attempts = tmp_path / "attempts"
    # an ended attempt's leftover that ignores SIGTERM: the sweep waits out the grace period
    old = marked(attempts, "run-old-1", "trap '' TERM; while :; do sleep 0.1; done")
    time.sleep(0.3)  # its trap is set
    result: dict[str, object] = {}
    sweep = threading.Thread(
        target=lambda: result.update(host_processes.stop_ended(str(attempts), [], PLANE))
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
        settled(ended, live)
        result = host_processes.stop_ended(str(attempts), ["run-live-1"], PLANE)
        assert set(result["stopped"]) == {"run-ended-1"}
        eventually(lambda: not process_alive(ended.pid), timeout=10)
        assert process_alive(live.pid) and process_alive(stranger.pid)
    finally:
        for proc in (ended, live, stranger):
            proc.kill()
            proc.wait()


def _staged(tmp_path: Path) -> tuple[Path, str]:
    """A host's work dir with one bundle staged as an SSH push leaves it (complete)."""
    from orbit.core.execution.bundle import freeze_bundle
    from orbit.model.models import JobSpec
    from orbit.model.task import StagedPath

    source = tmp_path / "src"
    source.mkdir(parents=True)
    (source / "train.sh").write_text("echo original\n")
    os.chmod(source / "train.sh", 0o755)
    (source / "data").mkdir()
    (source / "data" / "x.txt").write_text("1\n")
    job = JobSpec.model_validate(
        {
            "entrypoint": ["sh", "train.sh"],
            "task_type": "command",
            "template_id": "local",
            "launch_mode": {"kind": "host_process"},
        }
    )
    bundle = freeze_bundle(job, [StagedPath(source=source, dest="workdir")], tmp_path / "cache")
    work = tmp_path / "work"
    host_staging.stage_check(str(work), bundle.digest)
    partial = work / "bundles" / f".partial-{bundle.digest}"
    subprocess.run(["cp", "-R", f"{bundle.path}/.", str(partial)], check=True)
    assert "bundle" in host_staging.stage_commit(str(work), bundle.digest)
    return work, bundle.digest


def test_prepare_copies_only_a_cached_bundle_that_still_gives_its_digest(tmp_path: Path) -> None:
    """A host's cached bundle is checked as each attempt's copy is made: one a task changed
    (a file rewritten, one added, a mode bit) is not run, and leaves the cache so that the
    next launch stages it afresh; an unchanged one copies as it was frozen."""
    work, digest = _staged(tmp_path)
    cached = work / "bundles" / digest
    good = host_staging.prepare(str(work), digest, "a1")
    assert good == {"location": str(work / "attempts" / "a1")}
    copy = Path(good["location"])
    assert (copy / "inputs" / "workdir" / "train.sh").read_text() == "echo original\n"
    assert os.access(copy / "inputs" / "workdir" / "train.sh", os.X_OK)
    assert (copy / "runtime").is_dir() and (copy / "artifacts").is_dir()
    assert not (copy / "scripts" / "__pycache__").exists()  # a host's .pyc are not handed on
    changes = {
        "rewritten": lambda w: (w / "train.sh").write_text("echo PWNED\n"),
        "added": lambda w: (w / "sitecustomize.py").write_text("x = 1\n"),
        "mode": lambda w: os.chmod(w / "train.sh", 0o644),
    }
    for name, change in changes.items():
        work, digest = _staged(tmp_path / name)
        cached = work / "bundles" / digest
        change(cached / "inputs" / "workdir")
        said = host_staging.prepare(str(work), digest, "a2")
        assert "was changed after it was staged" in said["error"], said
        assert not (work / "attempts" / "a2").exists() and not cached.exists()
        assert host_staging.stage_check(str(work), digest)["cached"] is False


def test_over_ssh_hostside_and_its_siblings_arrive_as_one_program(tmp_path: Path) -> None:
    """`ssh HOST python3 - COMMAND ...` reads one program from stdin: hostside's siblings
    arrive inside it, so that an interpreter with no orbit to fall back on and no scripts/
    beside it runs every command, and a failure is still one JSON object on stdout."""
    from orbit.core.execution.ssh.transport import hostside_program

    bare = [sys.executable, "-I", "-S"]  # no site-packages, no current folder on its path
    assert subprocess.run([*bare, "-c", "import orbit"], capture_output=True).returncode != 0

    def run(*args: str) -> dict[str, Any]:
        proc = subprocess.run(
            [*bare, "-", *args],
            input=hostside_program(),
            capture_output=True,
            cwd=tmp_path,
            timeout=60,
            check=True,
        )
        found = json.loads(proc.stdout)
        assert isinstance(found, dict)
        return found

    work = tmp_path / "work"
    assert run("stage-check", str(work), "d1") == {
        "work": str(work),
        "cached": False,
        "partial": "bundles/.partial-d1",
    }
    assert run("probe", str(work / "attempts" / "a1"), "a1") == {"missing": True}
    assert run("stop-ended", str(work / "attempts"), PLANE, "a1") == {"stopped": {}}
    (work / "note.txt").write_text("hello")
    assert run("read", str(work / "note.txt"), "1", "3") == {"data": "ZWxs"}  # b"ell"
    assert run("nonsense") == {"error": "unknown command 'nonsense'"}
    assert run("probe")["error"].startswith("TypeError: probe() missing")
