"""The runtime wrapper, run by hand as a user would on a bare box: `bash scripts/run.sh` with
nothing but bash and the system python3 (which has neither pydantic nor orbit installed)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest

from orbit.core.execution.backends.local_host_process import LocalHostProcessBackend, wrapper_alive
from orbit.core.execution.bundle import freeze_bundle
from orbit.core.execution.bundle_archive import create_bundle_archive, extract_bundle_archive
from orbit.core.execution.runtime_state import parse_json, status_from_files
from orbit.model.models import FailureKind, FailureReason, JobSpec, LaunchMode, RunHandle, RunState
from orbit.model.task import StagedPath
from orbit.runtime import host_processes
from tests.helpers import group_alive, process_alive

SYSTEM_PYTHON = "/usr/bin/python3"
BARE_ENV = ("env", "-i", "PATH=/usr/bin:/bin", f"ORBIT_PYTHON={SYSTEM_PYTHON}")
T = TypeVar("T")

pytestmark = pytest.mark.skipif(
    not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"no system python at {SYSTEM_PYTHON}"
)

TASK_PY = """\
import json, os, sys
print("hello on stdout", flush=True)
print("hello on stderr", file=sys.stderr, flush=True)
art = os.environ["ORBIT_ARTIFACTS_DIR"]
os.makedirs(os.path.join(art, "checkpoints", "step-1"))
with open(os.path.join(art, "checkpoints", "step-1", "model.bin"), "wb") as f:
    f.write(bytes(range(256)) * 40)
names = ["ORBIT_RUN_ID", "ORBIT_ATTEMPT_ID", "ORBIT_BUNDLE_DIR", "ORBIT_INPUTS_DIR",
         "ORBIT_ARTIFACTS_DIR", "GREETING"]
seen = {name: os.environ.get(name) for name in names}
seen["cwd"] = os.getcwd()
with open(os.path.join(art, "seen.json"), "w") as f:
    json.dump(seen, f)
"""


# --- helpers ----------------------------------------------------------------------------------


def make_bundle(
    tmp_path: Path,
    script: str = "",
    *,
    entrypoint: tuple[str, ...] = ("bash", "task.sh"),
    stop_grace_s: float = 10.0,
    env: dict[str, str] | None = None,
) -> Path:
    """Freeze a bundle whose workdir holds task.sh (or task.py), ship it as an archive and
    extract it where it will run, as on a fresh box."""
    src = tmp_path / "project"
    src.mkdir()
    (src / "task.sh").write_text(script)
    (src / "task.py").write_text(TASK_PY)
    spec = JobSpec(
        task_type="command",
        template_id="local",
        launch_mode=LaunchMode(kind="host_process"),
        entrypoint=entrypoint,
        env=env or {},
        stop_grace_s=stop_grace_s,
    )
    frozen = freeze_bundle(spec, [StagedPath(src, "workdir")], tmp_path / "cache")
    archive = create_bundle_archive(frozen.path, tmp_path / "bundle.tar")
    return extract_bundle_archive(archive, tmp_path / "a box" / "bundle")  # a space: quoting


def run_by_hand(
    bundle: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    extra = [f"{k}={v}" for k, v in (env or {}).items()]
    return subprocess.run(
        [*BARE_ENV, *extra, "bash", "scripts/run.sh", *args],
        cwd=bundle,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_optional(path: Path) -> dict[str, Any] | None:
    return parse_json(path.read_bytes()) if path.exists() else None


def read_json(path: Path) -> dict[str, Any]:
    data = read_optional(path)
    assert data is not None, f"{path} is missing or not a JSON object"
    return data


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 10.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def wait_running(bundle: Path) -> dict[str, Any]:
    """Wait for status.json to say running; returns it (with task_pid)."""

    def running() -> dict[str, Any] | None:
        status = read_optional(bundle / "runtime" / "status.json")
        return status if status and status.get("state") == "running" else None

    return wait_for("the task to start", running)


def wait_log(bundle: Path, text: str) -> None:
    log = bundle / "artifacts" / "training.log"
    wait_for(f"{text!r} in training.log", lambda: log.exists() and text in log.read_text())


def wait_finished(bundle: Path, timeout: float = 10.0) -> dict[str, Any]:
    """Wait until the wrapper wrote its result and let go of its lock; returns the result."""
    runtime = bundle / "runtime"
    wait_for(
        "the wrapper to finish",
        lambda: (runtime / "result.json").exists() and not wrapper_alive(runtime),
        timeout,
    )
    return read_json(runtime / "result.json")


def detach(bundle: Path) -> int:
    started = time.monotonic()
    proc = run_by_hand(bundle, "--detach", timeout=15)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - started < 5, "--detach must return at once"
    return int(proc.stdout.strip())


@pytest.fixture
def bundles() -> Iterator[list[Path]]:
    """Bundles a test started: whatever still runs of them is killed afterwards."""
    started: list[Path] = []
    yield started
    for bundle in started:
        runtime = bundle / "runtime"
        if wrapper_alive(runtime):
            os.kill(int((runtime / "pid").read_text()), signal.SIGKILL)
        # by the mark the task's processes carry, not by a recorded pid: one long ended may
        # be another test's process now
        for pid in host_processes.marked([f"ORBIT_BUNDLE_DIR={os.path.abspath(bundle)}"], set()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def manifest_is_true(artifacts: Path) -> list[dict[str, Any]]:
    """The manifest's entries, checked against the files on disk."""
    manifest = read_json(artifacts / "manifest.json")
    assert manifest["schema_version"] == 1
    entries = manifest["files"]
    on_disk = sorted(
        p.relative_to(artifacts).as_posix()
        for p in artifacts.rglob("*")
        if p.is_file() and p.name != "manifest.json"
    )
    assert sorted(e["path"] for e in entries) == on_disk
    for e in entries:
        content = (artifacts / e["path"]).read_bytes()
        assert e["size"] == len(content), e["path"]
        assert e["sha256"] == hashlib.sha256(content).hexdigest(), e["path"]
    return entries


# --- the premise: a bare python ---------------------------------------------------------------


@pytest.mark.parametrize("module", ["orbit", "pydantic"])
def test_the_system_python_has_no_orbit_and_no_pydantic(module: str) -> None:
    proc = subprocess.run(
        [*BARE_ENV, SYSTEM_PYTHON, "-c", f"import {module}"], capture_output=True, text=True
    )
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr


# --- one attempt, start to finish ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        ({}, ("manual", "manual")),
        ({"ORBIT_RUN_ID": "r-42", "ORBIT_ATTEMPT_ID": "a-2"}, ("r-42", "a-2")),
        (
            {
                "ORBIT_RUN_ID": "r-43",
                "ORBIT_ATTEMPT_ID": "a-1",
                "ORBIT_BUNDLE_DIGEST": "d" * 64,
                "ORBIT_TEMPLATE": "local",
                "ORBIT_BACKEND": "local_host_process",
                "ORBIT_TARGET": "localhost",
            },
            ("r-43", "a-1"),
        ),
    ],
)
def test_a_succeeding_task_leaves_status_result_logs_and_manifest(
    tmp_path: Path, ids: dict[str, str], expected: tuple[str, str]
) -> None:
    bundle = make_bundle(tmp_path, entrypoint=("python3", "task.py"), env={"GREETING": "hi"})
    proc = run_by_hand(bundle, env=ids)
    assert proc.returncode == 0, proc.stderr

    runtime, artifacts = bundle / "runtime", bundle / "artifacts"
    assert read_json(runtime / "status.json")["state"] == "succeeded"
    result = read_json(runtime / "result.json")
    assert result["state"] == "succeeded"
    assert result["exit_code"] == 0
    assert result["host"] == socket.gethostname()
    started = datetime.fromisoformat(result["started_at"])
    finished = datetime.fromisoformat(result["finished_at"])
    assert started.tzinfo is not None and started <= finished

    log = (artifacts / "training.log").read_text()
    assert "hello on stdout" in log and "hello on stderr" in log

    steps = (runtime / "runtime.log").read_text()
    for step in ("wrapper started", "state -> starting", "starting task in", "state -> running"):
        assert step in steps
    assert "task exited with 0" in steps and "state -> succeeded" in steps

    # the bundle on its own tells its last run, and the manifest where its files came from
    last = read_json(runtime / "last_run.json")
    source = {
        "run_id": expected[0],
        "attempt_id": expected[1],
        "bundle_digest": ids.get("ORBIT_BUNDLE_DIGEST"),
        "template": ids.get("ORBIT_TEMPLATE"),
    }
    assert {k: last[k] for k in source} == source
    assert read_json(artifacts / "manifest.json")["run"] == source
    assert last["handle"] == {
        "backend": ids.get("ORBIT_BACKEND"),
        "target": ids.get("ORBIT_TARGET"),
        "host": socket.gethostname(),
        "location": str(bundle.resolve()),
    }
    assert (last["state"], last["exit_code"]) == ("succeeded", 0)
    assert (last["started_at"], last["finished_at"]) == (
        result["started_at"],
        result["finished_at"],
    )
    assert last["task_pid"] == last["task_pgid"] and last["task_pid"] != last["wrapper_pid"]

    entries = manifest_is_true(artifacts)
    paths = {e["path"] for e in entries}
    assert paths == {
        "training.log",
        "runtime-precheck.log",
        "nvml-audit.jsonl",
        "seen.json",
        "checkpoints/step-1/model.bin",
    }

    seen = read_json(artifacts / "seen.json")
    assert (seen["ORBIT_RUN_ID"], seen["ORBIT_ATTEMPT_ID"]) == expected
    assert Path(seen["ORBIT_BUNDLE_DIR"]).resolve() == bundle.resolve()
    assert Path(seen["ORBIT_INPUTS_DIR"]).resolve() == (bundle / "inputs").resolve()
    assert Path(seen["ORBIT_ARTIFACTS_DIR"]).resolve() == artifacts.resolve()
    assert Path(seen["cwd"]).resolve() == (bundle / "inputs" / "workdir").resolve()
    assert seen["GREETING"] == "hi"

    assert not wrapper_alive(runtime)
    found = status_from_files(
        read_json(runtime / "status.json"), read_json(runtime / "result.json"), False
    )
    assert found.state is RunState.SUCCEEDED and found.exit_code == 0


def test_run_sh_works_from_any_folder(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, "pwd\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run(
        [*BARE_ENV, "bash", str(bundle / "scripts" / "run.sh")],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert read_json(bundle / "runtime" / "result.json")["state"] == "succeeded"
    workdir = (bundle / "inputs" / "workdir").resolve()
    assert str(workdir) in (bundle / "artifacts" / "training.log").read_text()


def test_a_nonzero_exit_is_the_tasks_failure(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, "echo working\necho 'bad things' >&2\nexit 3\n")
    proc = run_by_hand(bundle)
    assert proc.returncode != 0
    result = read_json(bundle / "runtime" / "result.json")
    assert result["state"] == "failed"
    assert result["reason"] == "task_exit_nonzero"
    assert result["exit_code"] == 3
    assert "signal" not in result
    assert read_json(bundle / "runtime" / "status.json")["state"] == "failed"
    assert "bad things" in (bundle / "artifacts" / "training.log").read_text()
    assert "task exited with 3" in (bundle / "runtime" / "runtime.log").read_text()
    manifest_is_true(bundle / "artifacts")
    found = status_from_files(None, result, wrapper_alive=False)
    assert found.reason is FailureReason.TASK_EXIT_NONZERO
    assert found.reason.kind is FailureKind.TASK


def test_a_task_killed_by_a_signal_is_task_killed(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, "echo about to die\nkill -9 $$\necho never\n")
    proc = run_by_hand(bundle)
    assert proc.returncode != 0
    result = read_json(bundle / "runtime" / "result.json")
    assert result["state"] == "failed"
    assert result["reason"] == "task_killed"
    assert result["signal"] == 9
    assert "exit_code" not in result
    log = (bundle / "artifacts" / "training.log").read_text()
    assert "about to die" in log and "never" not in log


def test_an_entrypoint_that_does_not_exist_fails_with_127(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, entrypoint=("no-such-trainer", "--epochs", "3"))
    proc = run_by_hand(bundle)
    assert proc.returncode != 0
    result = read_json(bundle / "runtime" / "result.json")
    assert result["state"] == "failed"
    assert result["exit_code"] == 127
    assert result["reason"] == "task_exit_nonzero"
    assert "no-such-trainer" in result["message"]
    log = (bundle / "artifacts" / "training.log").read_text()
    assert "cannot start 'no-such-trainer'" in log
    assert "cannot start the task" in (bundle / "runtime" / "runtime.log").read_text()
    assert read_json(bundle / "runtime" / "status.json")["state"] == "failed"


def test_a_broken_job_file_is_the_wrappers_failure_not_the_tasks(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, "echo should not run\n")
    (bundle / "job.json").write_text('{"entrypoint": ["bash", "task.sh"')  # torn
    proc = run_by_hand(bundle)
    assert proc.returncode != 0
    result = read_json(bundle / "runtime" / "result.json")
    assert result["state"] == "failed"
    assert result["reason"] == "runtime_lost"
    assert "wrapper error" in (bundle / "runtime" / "runtime.log").read_text()
    assert not (bundle / "artifacts" / "training.log").exists()
    found = status_from_files(None, result, wrapper_alive=False)
    assert found.reason is FailureReason.RUNTIME_LOST
    assert found.reason.kind is FailureKind.INFRASTRUCTURE


def test_a_background_child_does_not_outlive_the_task(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, "sleep 300 &\necho $! > bg.pid\necho spawned\nexit 0\n")
    proc = run_by_hand(bundle)
    assert proc.returncode == 0, proc.stderr
    child = int((bundle / "inputs" / "workdir" / "bg.pid").read_text())
    wait_for("the background sleep to be gone", lambda: not process_alive(child), timeout=5)


# --- detached, stopped, lost ------------------------------------------------------------------


def test_detach_returns_at_once_and_the_wrapper_lives_on(
    tmp_path: Path, bundles: list[Path]
) -> None:
    bundle = make_bundle(tmp_path, "echo started\nsleep 30\n")
    bundles.append(bundle)
    assert not wrapper_alive(bundle / "runtime")  # never started: no lock held
    pid = detach(bundle)
    runtime = bundle / "runtime"
    assert int((runtime / "pid").read_text()) == pid
    assert process_alive(pid)
    status = wait_running(bundle)
    assert status["wrapper_pid"] == pid
    assert wrapper_alive(runtime)
    assert not (runtime / "result.json").exists()
    handle = RunHandle(
        backend_key="local_host_process",
        target="localhost",
        attempt_id="manual",
        location=str(bundle),
    )
    assert LocalHostProcessBackend(tmp_path).status(handle).state is RunState.RUNNING

    os.kill(pid, signal.SIGTERM)
    result = wait_finished(bundle)
    assert result["state"] == "terminated"
    assert not wrapper_alive(runtime)
    wait_for("the wrapper process to exit", lambda: not process_alive(pid), timeout=5)


def test_a_second_detached_start_is_refused_and_the_first_keeps_its_pid(
    tmp_path: Path, bundles: list[Path]
) -> None:
    bundle = make_bundle(tmp_path, "sleep 30\n")
    bundles.append(bundle)
    pid = detach(bundle)
    wait_running(bundle)
    started = time.monotonic()
    again = run_by_hand(bundle, "--detach", timeout=15)
    assert again.returncode != 0
    assert "already running" in again.stderr
    assert time.monotonic() - started < 5
    assert int((bundle / "runtime" / "pid").read_text()) == pid
    assert wrapper_alive(bundle / "runtime")


@pytest.mark.parametrize(
    ("sig", "request_file", "reason"),
    [
        (signal.SIGTERM, None, "preempted"),  # nobody said why: the machine is going away
        (signal.SIGTERM, {"reason": "cancelled"}, "cancelled"),  # `orbit cancel` says why
        (signal.SIGINT, None, "cancelled"),  # Ctrl-C in the terminal that ran it
        (signal.SIGHUP, None, "cancelled"),  # that terminal closed
    ],
)
def test_a_stop_signal_stops_the_task_gracefully(
    tmp_path: Path,
    bundles: list[Path],
    sig: signal.Signals,
    request_file: dict[str, str] | None,
    reason: str,
) -> None:
    script = (
        "trap 'echo saving a checkpoint; exit 0' TERM\necho ready\nwhile :; do sleep 0.1; done\n"
    )
    bundle = make_bundle(tmp_path, script)
    bundles.append(bundle)
    pid = detach(bundle)
    task_pid = wait_running(bundle)["task_pid"]
    wait_log(bundle, "ready")
    if request_file:
        (bundle / "runtime" / "stop_request.json").write_text(json.dumps(request_file))
    os.kill(pid, sig)
    result = wait_finished(bundle)
    assert result["state"] == "terminated"
    assert result["reason"] == reason
    assert result["exit_code"] == 0
    assert read_json(bundle / "runtime" / "status.json")["state"] == "terminated"
    assert "saving a checkpoint" in (bundle / "artifacts" / "training.log").read_text()
    steps = (bundle / "runtime" / "runtime.log").read_text()
    assert f"received {sig.name}" in steps
    assert "grace period over" not in steps
    wait_for("the task's group to be gone", lambda: not group_alive(task_pid), timeout=5)
    manifest_is_true(bundle / "artifacts")


def test_a_task_that_ignores_sigterm_is_killed_after_the_grace(
    tmp_path: Path, bundles: list[Path]
) -> None:
    script = "trap '' TERM\nsleep 300 &\necho ready\nsleep 30\n"
    bundle = make_bundle(tmp_path, script, stop_grace_s=1)
    bundles.append(bundle)
    pid = detach(bundle)
    task_pid = wait_running(bundle)["task_pid"]
    wait_log(bundle, "ready")
    stopped = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    result = wait_finished(bundle, timeout=8)
    took = time.monotonic() - stopped
    assert 0.9 <= took < 6, f"stopped after {took:.1f}s with a 1s grace"
    assert result["state"] == "terminated"
    assert result["reason"] == "preempted"
    assert result["signal"] == 9
    assert "grace period over" in (bundle / "runtime" / "runtime.log").read_text()
    wait_for("the task's group to be gone", lambda: not group_alive(task_pid), timeout=5)


def test_a_wrapper_killed_mid_run_is_runtime_lost_never_running(
    tmp_path: Path, bundles: list[Path]
) -> None:
    bundle = make_bundle(tmp_path, "echo ready\nsleep 30\n")
    bundles.append(bundle)
    runtime = bundle / "runtime"
    pid = detach(bundle)
    task_pid = wait_running(bundle)["task_pid"]
    assert wrapper_alive(runtime)

    os.kill(pid, signal.SIGKILL)
    wait_for("the lock to be free", lambda: not wrapper_alive(runtime), timeout=5)
    assert not (runtime / "result.json").exists()
    found = status_from_files(read_json(runtime / "status.json"), None, wrapper_alive(runtime))
    assert found.state is RunState.FAILED
    assert found.reason is FailureReason.RUNTIME_LOST
    assert found.reason.kind is FailureKind.INFRASTRUCTURE

    handle = RunHandle(
        backend_key="local_host_process",
        target="localhost",
        attempt_id="manual",
        location=str(bundle),
    )
    reported = LocalHostProcessBackend(tmp_path).status(handle)
    assert reported.state is RunState.FAILED
    assert reported.reason is FailureReason.RUNTIME_LOST
    # the orphaned task does not run on unwatched
    wait_for("the orphaned task to be stopped", lambda: not group_alive(task_pid), timeout=5)


def test_running_a_bundle_again_starts_from_a_clean_result(
    tmp_path: Path, bundles: list[Path]
) -> None:
    """A user reruns `scripts/run.sh` in the same folder after a failure: while the new attempt
    runs, the old result must not make it look finished, and the new manifest is true."""
    script = "if [ -e ran-once ]; then echo second; sleep 30; else touch ran-once; exit 3; fi\n"
    bundle = make_bundle(tmp_path, script)
    bundles.append(bundle)
    runtime = bundle / "runtime"
    assert run_by_hand(bundle).returncode != 0
    assert read_json(runtime / "result.json")["exit_code"] == 3

    pid = detach(bundle)
    wait_running(bundle)
    wait_log(bundle, "second")
    assert not (runtime / "result.json").exists()
    handle = RunHandle(
        backend_key="local_host_process",
        target="localhost",
        attempt_id="manual",
        location=str(bundle),
    )
    assert LocalHostProcessBackend(tmp_path).status(handle).state is RunState.RUNNING

    os.kill(pid, signal.SIGTERM)
    result = wait_finished(bundle)
    assert result["state"] == "terminated"
    entries = manifest_is_true(bundle / "artifacts")
    assert "manifest.json" not in {e["path"] for e in entries}


def test_a_stop_asked_before_the_wrapper_started_ends_it_without_running_the_task(
    tmp_path: Path,
) -> None:
    """A cancel that came while the attempt was being launched (its stop request written, its
    signal lost): the wrapper ends the attempt as asked, the task never starts. Run again in
    the same folder later, the old stop no longer holds."""
    bundle = make_bundle(tmp_path, "echo ran > ran.txt\n")
    runtime = bundle / "runtime"
    runtime.mkdir(exist_ok=True)
    (runtime / "stop_request.json").write_text('{"reason": "cancelled"}\n')
    assert run_by_hand(bundle).returncode != 0
    result = read_json(runtime / "result.json")
    assert (result["state"], result["reason"]) == ("terminated", "cancelled")
    assert not (bundle / "inputs" / "workdir" / "ran.txt").exists()
    assert "not starting it" in (runtime / "runtime.log").read_text()
    assert run_by_hand(bundle).returncode == 0  # a rerun: the last run's stop is not its own
    assert read_json(runtime / "result.json")["state"] == "succeeded"
    assert (bundle / "inputs" / "workdir" / "ran.txt").exists()


def test_a_stop_that_reaches_the_task_before_the_wrapper_is_still_the_stop(
    tmp_path: Path,
) -> None:
    """A signal to a whole process tree (Slurm's TERM to a job step) may kill the task before
    the wrapper has taken it: with a stop asked, the attempt ended by that stop, not by the
    task's death."""
    script = (
        'printf \'{"reason": "max_runtime"}\\n\' > "$ORBIT_BUNDLE_DIR/runtime/stop_request.json"\n'
        "kill -TERM $$\n"
    )
    bundle = make_bundle(tmp_path, script)
    assert run_by_hand(bundle).returncode != 0
    result = read_json(bundle / "runtime" / "result.json")
    assert (result["state"], result["reason"], result["signal"]) == (
        "terminated",
        "max_runtime",
        15,
    )
    (tmp_path / "other").mkdir()
    killed = make_bundle(tmp_path / "other", "kill -TERM $$\n")  # no stop asked: the task's end
    run_by_hand(killed)
    assert read_json(killed / "runtime" / "result.json")["reason"] == "task_killed"


def ended_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[subprocess.Popen[bytes], Any, list[tuple[int, int]]]:
    """A wrapper whose task has exited (as its wait() saw it), and the group signals it sends."""
    from orbit.runtime import wrapper

    task = subprocess.Popen(["true"], start_new_session=True)
    wait_for("the task to exit", lambda: wrapper.exited(task) or None)
    w = wrapper.Wrapper(str(tmp_path))
    w.child = task
    signalled: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: signalled.append((pgid, sig)))
    return task, w, signalled


def test_an_ended_task_is_left_unreaped_until_its_group_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reaped task's pid, its process group's id, may be another process's the next moment
    (pid_max is 32768 on many hosts): a stop signal then must reach no stranger's group."""
    task, w, signalled = ended_task(tmp_path, monkeypatch)
    state = Path(f"/proc/{task.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    assert state == "Z"  # exited, its pid still held
    w.signal_task(signal.SIGKILL)
    assert signalled == [(task.pid, signal.SIGKILL)]
    task.wait()
    w.signal_task(signal.SIGTERM)  # a stop that comes while the manifest is written
    assert signalled == [(task.pid, signal.SIGKILL)]


def test_where_a_task_is_reaped_on_the_spot_its_group_is_still_killed_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No waitid (macOS): the wrapper learns of the exit by reaping, and the group kill that
    follows is then the only stop of what the task left (no /proc to find it by its mark)."""
    from orbit.runtime import wrapper

    monkeypatch.setattr(wrapper, "REAPS_AFTER_KILL", False)
    task, w, signalled = ended_task(tmp_path, monkeypatch)
    assert task.returncode == 0  # reaped
    w.signal_task(signal.SIGKILL)
    assert signalled == [(task.pid, signal.SIGKILL)]
