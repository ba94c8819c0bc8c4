"""CoreControlService end to end on this machine: real store, real detached processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orbit.core.control.service import CoreControlService
from orbit.model.errors import InvalidInput, NotFound, Refused
from orbit.model.models import (
    ExecutionOverrides,
    FailureReason,
    RetryPolicy,
    RunState,
    TaskSubmission,
)
from orbit.store import Store
from tests.helpers import eventually, group_alive, orbit, write_spec


def submission(command: str | list[str] = "echo hello", **fields: object) -> TaskSubmission:
    data: dict[str, object] = {
        "experiment_id": "exp",
        "task_type": "command",
        "task_request": {"command": command},
        "template_id": "local",
    }
    data.update(fields)
    return TaskSubmission.model_validate(data)


def submit(service: CoreControlService, tmp_path: Path, *args: object, **kw: object):  # type: ignore[no-untyped-def]
    return service.submit_task(submission(*args, **kw), base_dir=tmp_path)  # type: ignore[arg-type]


def test_a_run_executes_detached_and_its_outputs_are_read_back(
    service: CoreControlService, tmp_path: Path
) -> None:
    script = (
        'echo "to stdout"; echo "to stderr" >&2; '
        'mkdir -p "$ORBIT_ARTIFACTS_DIR/checkpoints"; '
        'echo w > "$ORBIT_ARTIFACTS_DIR/checkpoints/c.bin"; '
        'echo "$ORBIT_RUN_ID $ORBIT_ATTEMPT_ID" > "$ORBIT_ARTIFACTS_DIR/ids.txt"'
    )
    run = submit(service, tmp_path, script)
    assert run.current.state is RunState.SUBMITTED
    done = service.wait_for(run.id, timeout_s=20, poll_s=0.05)
    assert done.state is RunState.SUCCEEDED
    assert done.current.exit_code == 0
    assert done.current.started_at is not None and done.current.finished_at is not None
    log = service.read_log(run.id, layer=_training()).data.decode()
    assert "to stdout" in log and "to stderr" in log
    dest = tmp_path / "collected"
    result = service.collect_run_artifacts(run.id, dest)
    assert result.verified and not result.problems
    assert (dest / "checkpoints" / "c.bin").read_text() == "w\n"
    assert (dest / "ids.txt").read_text().split() == [run.id, f"{run.id}-1"]
    actions = [e.action for e in service.audit(run.id)]
    assert actions[:4] == ["run.created", "attempt.created", "attempt.state", "run.submitted"]
    assert "run.collected" in actions


def _training():  # type: ignore[no-untyped-def]
    from orbit.core.execution.backends.base import LogLayer

    return LogLayer.TRAINING


def test_the_bundle_holds_no_run_identity_and_is_shared_by_equal_submissions(
    service: CoreControlService, tmp_path: Path
) -> None:
    first = submit(service, tmp_path, "true")
    second = submit(service, tmp_path, "true")
    assert first.id != second.id
    assert first.bundle_digest == second.bundle_digest
    job = json.loads((service.bundles_dir / first.bundle_digest / "job.json").read_text())
    assert first.id not in json.dumps(job) and "localhost" not in json.dumps(job)
    assert job["entrypoint"] == ["bash", "-c", "true"]
    other = submit(service, tmp_path, "false")
    assert other.bundle_digest != first.bundle_digest


def test_refusals_write_nothing_to_the_store(service: CoreControlService, tmp_path: Path) -> None:
    with pytest.raises(
        NotFound, match=r"unknown template 'nope' \(known: local, local-docker, .*targon-rental"
    ):
        submit(service, tmp_path, template_id="nope")
    with pytest.raises(Refused, match=r"override 'target' is not allowed by template 'local'"):
        submit(service, tmp_path, overrides=ExecutionOverrides(target="h100-a"))
    with pytest.raises(Refused, match="target 'h100-a' is not a registered host"):
        submit(
            service,
            tmp_path,
            template_id="targon-rental-host",
            overrides=ExecutionOverrides(target="h100-a"),
        )
    with pytest.raises(NotFound, match="unknown task type 'nope'"):
        submit(service, tmp_path, task_type="nope")
    with pytest.raises(InvalidInput, match=r"task\.command"):
        service.submit_task(
            submission(task_request={"command": 5}),
            base_dir=tmp_path,  # type: ignore[arg-type]
        )
    with pytest.raises(InvalidInput, match="experiment name 'bad name!'"):
        submit(service, tmp_path, experiment_id="bad name!")
    assert service.list_runs() == []
    assert service.list_experiments() == []
    assert service.audit() == []
    bundles = service.bundles_dir
    assert not bundles.exists() or list(bundles.iterdir()) == []  # nothing was frozen either


def test_a_vanished_wrapper_is_an_infrastructure_failure_and_is_retried(
    service: CoreControlService, tmp_path: Path
) -> None:
    # attempt 1 hangs; attempt 2 succeeds at once
    script = 'case "$ORBIT_ATTEMPT_ID" in *-1) sleep 60;; esac; echo done'
    run = submit(service, tmp_path, script, retry=RetryPolicy(backoff_s=0.2))
    location = Path(run.current.handle.location)  # type: ignore[union-attr]
    eventually(lambda: service.refresh_run_status(run.id).state is RunState.RUNNING)
    wrapper_pid = int((location / "runtime" / "pid").read_text())
    task_pid = json.loads((location / "runtime" / "status.json").read_text())["task_pid"]
    os.kill(wrapper_pid, signal.SIGKILL)
    done = service.wait_for(run.id, timeout_s=20, poll_s=0.05)
    first, second = done.attempts
    assert first.state is RunState.FAILED
    assert first.reason is FailureReason.RUNTIME_LOST
    assert second.trigger == "auto_retry" and second.state is RunState.SUCCEEDED
    assert done.state is RunState.SUCCEEDED
    eventually(lambda: not group_alive(task_pid), timeout=5)  # the orphaned task is gone


def test_task_exits_are_retried_only_when_listed(
    service: CoreControlService, tmp_path: Path
) -> None:
    plain = service.wait_for(submit(service, tmp_path, "exit 3").id, timeout_s=20, poll_s=0.05)
    assert [a.state for a in plain.attempts] == [RunState.FAILED]
    assert plain.current.reason is FailureReason.TASK_EXIT_NONZERO
    assert plain.current.exit_code == 3

    listed = submit(
        service,
        tmp_path,
        "exit 3",
        retry=RetryPolicy(max_retries=2, on_exit_codes=(3,), backoff_s=0.1),
    )
    listed = service.wait_for(listed.id, timeout_s=30, poll_s=0.05)
    while len(listed.attempts) < 3 or not listed.state.terminal:
        listed = service.wait_for(listed.id, timeout_s=30, poll_s=0.05)
    assert [a.trigger for a in listed.attempts] == ["submit", "auto_retry", "auto_retry"]
    assert all(a.exit_code == 3 for a in listed.attempts)
    assert listed.state is RunState.FAILED


def test_cancel_stops_the_task_gracefully_and_is_never_retried(
    service: CoreControlService, tmp_path: Path
) -> None:
    marker = tmp_path / "got-term"
    script = f"trap 'echo term > {marker}; exit 0' TERM; echo ready; sleep 60 & wait"
    run = submit(service, tmp_path, script)
    eventually(lambda: b"ready" in service.read_log(run.id, _training()).data)
    done = service.cancel_run(run.id)
    assert done.state is RunState.TERMINATED
    assert done.current.reason is FailureReason.CANCELLED
    assert len(done.attempts) == 1
    assert marker.read_text() == "term\n"
    assert "run.cancel_requested" in [e.action for e in service.audit(run.id)]


def test_retry_pushes_the_same_bundle_as_a_new_attempt(
    service: CoreControlService, tmp_path: Path
) -> None:
    run = service.wait_for(
        submit(service, tmp_path, "echo once; exit 1").id, timeout_s=20, poll_s=0.05
    )
    assert run.state is RunState.FAILED
    with pytest.raises(Refused, match="would change the bundle"):
        service.retry_run(
            run.id, ExecutionOverrides.model_validate({"resources": {"cpu_count": 2}})
        )
    with pytest.raises(Refused, match="override 'target' is not allowed"):
        service.retry_run(run.id, ExecutionOverrides(target="elsewhere"))
    again = service.retry_run(run.id)
    assert [a.trigger for a in again.attempts] == ["submit", "retry"]
    assert again.bundle_digest == run.bundle_digest
    again = service.wait_for(run.id, timeout_s=20, poll_s=0.05)
    a1, a2 = (Path(a.handle.location) for a in again.attempts)  # type: ignore[union-attr]
    assert a1 != a2
    # each attempt has its own runtime/ and artifacts/: nothing of attempt 1 rides along
    assert (a2 / "artifacts" / "training.log").read_text() == "once\n"
    assert (a1 / "artifacts" / "training.log").read_text() == "once\n"
    active = submit(service, tmp_path, "sleep 30")
    with pytest.raises(Refused, match="cancel it before retrying"):
        service.retry_run(active.id)
    service.cancel_run(active.id)


def test_collect_reports_files_that_differ_from_the_manifest(
    service: CoreControlService, tmp_path: Path
) -> None:
    run = submit(service, tmp_path, 'echo data > "$ORBIT_ARTIFACTS_DIR/out.txt"')
    run = service.wait_for(run.id, timeout_s=20, poll_s=0.05)
    (Path(run.current.handle.location) / "artifacts" / "out.txt").write_text("tampered\n")  # type: ignore[union-attr]
    result = service.collect_run_artifacts(run.id, tmp_path / "dest")
    assert not result.verified
    assert result.problems == ("out.txt: size 9, expected 5",)


def test_retry_says_so_when_the_bundle_left_the_cache(
    service: CoreControlService, tmp_path: Path
) -> None:
    import shutil

    run = service.wait_for(submit(service, tmp_path, "exit 1").id, timeout_s=20, poll_s=0.05)
    shutil.rmtree(service.bundles_dir / run.bundle_digest)
    with pytest.raises(NotFound, match="no longer in the cache"):
        service.retry_run(run.id)
    assert len(service.get_run(run.id).attempts) == 1


def test_replay_is_a_new_run_of_the_same_bundle(
    service: CoreControlService, tmp_path: Path
) -> None:
    original = service.wait_for(submit(service, tmp_path, "echo hi").id, timeout_s=20, poll_s=0.05)
    replay = service.wait_for(service.replay_run(original.id).id, timeout_s=20, poll_s=0.05)
    assert replay.id != original.id
    assert replay.replay_of == original.id
    assert replay.bundle_digest == original.bundle_digest
    assert replay.state is RunState.SUCCEEDED
    assert len(service.get_run(original.id).attempts) == 1  # the original is left as it was
    assert "run.replayed" in [e.action for e in service.audit(replay.id)]
    with pytest.raises(Refused, match="would change the bundle"):
        service.replay_run(original.id, ExecutionOverrides.model_validate({"stop_grace_s": 1}))


def test_secret_looking_env_is_never_frozen(service: CoreControlService, tmp_path: Path) -> None:
    with pytest.raises(Refused, match=r"env\.HF_TOKEN: the name looks like a secret"):
        service.submit_task(
            submission(task_request={"command": "true", "env": {"HF_TOKEN": "hf_x"}}),
            base_dir=tmp_path,
        )
    assert service.list_runs() == []


def test_automatic_retries_back_off_exponentially(
    service: CoreControlService, tmp_path: Path
) -> None:
    policy = RetryPolicy(max_retries=3, on_exit_codes=(3,), backoff_s=1.0, backoff_max_s=1.5)
    run = submit(service, tmp_path, "exit 3", retry=policy)
    # the first attempt fails at once; its retry waits out the backoff, prepared
    waiting = eventually(
        lambda: (r := service.refresh_run_status(run.id)).current.number == 2 and r
    )
    assert waiting.current.state is RunState.PREPARED and waiting.current.handle is None
    assert waiting.current.not_before is not None
    first_end = waiting.attempts[0].finished_at
    assert first_end is not None
    assert 0.5 < (waiting.current.not_before - first_end).total_seconds() <= 1.5
    done = service.wait_for(run.id, timeout_s=30, poll_s=0.05)
    while len(done.attempts) < 4 or not done.state.terminal:
        done = service.wait_for(run.id, timeout_s=30, poll_s=0.05)
    # each retry started no sooner than its backoff (1 s, then 2 s capped at 1.5 s) after
    # the attempt before it ended
    gaps = [
        (later.created_at, later.started_at, earlier.finished_at)
        for earlier, later in zip(done.attempts, done.attempts[1:], strict=False)
    ]
    for _created, started, ended in gaps:
        assert started is not None and ended is not None
    waits = [(s - e).total_seconds() for _c, s, e in gaps]  # type: ignore[operator]
    assert waits[0] >= 0.9 and waits[1] >= 1.4 and waits[2] >= 1.4, waits
    events = [
        e.data.get("backoff_s") for e in service.audit(run.id) if e.action == "run.auto_retry"
    ]
    assert events == [1.0, 1.5, 1.5]


def test_a_submit_killed_after_the_start_is_reconciled_to_its_true_state(
    orbit_home: Path, store_url: str, tmp_path: Path
) -> None:
    """The submitting process dies between starting the attempt and recording it: the next
    look finds the attempt where it runs and adopts it; it never runs twice."""
    count = tmp_path / "count"
    spec = write_spec(tmp_path, task={"command": f"echo ran >> {count}; sleep 1"})
    env = {**os.environ, "ORBIT_DATABASE_URL": store_url}
    killed = orbit({**env, "ORBIT_FAILPOINTS": "after-launch"}, "submit", str(spec), check=False)
    assert killed.returncode == -signal.SIGKILL
    store = Store(store_url)
    try:
        (left,) = store.runs.list_runs()
    finally:
        store.close()
    assert left.current.state is RunState.PREPARED and left.current.handle is None
    adopted = json.loads(orbit(env, "status", left.id, "--json", check=False).stdout)
    assert adopted["state"] in {"submitted", "starting", "running", "succeeded"}
    assert adopted["attempts"][0]["handle"]["location"].endswith(left.current.id)
    followed = orbit(env, "logs", left.id, "--follow", check=False)
    assert followed.returncode == 0 and "succeeded" in followed.stderr
    assert count.read_text() == "ran\n"  # it ran once
    audit = json.loads(orbit(env, "audit", "--run", left.id, "--json", check=False).stdout)
    (submitted,) = [e for e in audit if e["action"] == "run.submitted"]
    assert submitted["actor"] == "orbit" and submitted["data"]["adopted_from"]  # the dead one


def test_a_submit_killed_while_staging_ends_as_staging_failed_and_is_retried(
    orbit_home: Path, store_url: str, tmp_path: Path
) -> None:
    count = tmp_path / "count"
    spec = write_spec(
        tmp_path,
        task={"command": f"echo ran >> {count}"},
        retry={"max_retries": 1, "backoff_s": 0},
    )
    env = {**os.environ, "ORBIT_DATABASE_URL": store_url}
    killed = orbit({**env, "ORBIT_FAILPOINTS": "before-launch"}, "submit", str(spec), check=False)
    assert killed.returncode == -signal.SIGKILL
    (run,) = json.loads(orbit(env, "runs", "list", "--json", check=False).stdout)
    first = run["attempts"][0]
    assert (first["state"], first["reason"]) == ("failed", "staging_failed")
    assert "stopped before it started" in first["message"]
    assert [a["trigger"] for a in run["attempts"]] == ["submit", "auto_retry"]
    followed = orbit(env, "logs", run["id"], "--follow", check=False)
    assert followed.returncode == 0, followed.stderr
    assert count.read_text() == "ran\n"  # only the retry ran


def test_a_cancel_while_the_attempt_is_being_launched_stops_it_once_started(
    orbit_home: Path, store_url: str, tmp_path: Path
) -> None:
    """The launching process holds the attempt; a cancel from elsewhere is kept and delivered
    as soon as the launch is recorded, so nothing starts untracked or runs on."""
    ran = tmp_path / "ran"
    spec = write_spec(tmp_path, task={"command": f"sleep 2; touch {ran}"})
    env = {**os.environ, "ORBIT_DATABASE_URL": store_url}
    submitting = subprocess.Popen(
        [sys.executable, "-m", "orbit", "submit", str(spec), "--json"],
        env={**env, "ORBIT_FAILPOINTS": "before-launch=sleep:3"},
        stdout=subprocess.PIPE,
        text=True,
    )
    store = Store(store_url)
    try:
        run = eventually(lambda: (runs := store.runs.list_runs()) and runs[0])
    finally:
        store.close()
    cancelled = orbit(env, "cancel", run.id, "--json", check=False)
    assert cancelled.returncode == 0, cancelled.stderr
    asked = json.loads(cancelled.stdout)
    assert asked["state"] == "prepared" and asked["attempts"][0]["cancel_requested"] is True
    submitting.communicate(timeout=60)
    assert submitting.returncode == 0
    ended = eventually(
        lambda: (
            (r := json.loads(orbit(env, "status", run.id, "--json", check=False).stdout))["state"]
            == "terminated"
            and r
        ),
        timeout=30,
    )
    assert ended["attempts"][0]["reason"] == "cancelled"
    assert len(ended["attempts"]) == 1  # a cancelled attempt is not retried
    time.sleep(2.5)
    assert not ran.exists()  # it was stopped, not left to finish
