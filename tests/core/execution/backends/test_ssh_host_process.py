"""SSH rental hosts end to end, as a user drives them: the `orbit` CLI as a real process, real
sshd servers on loopback (or inside a network namespace) started by tests/sshd.py, real rsync.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from tests.helpers import ORBIT, eventually, orbit, orbit_json, write_spec
from tests.sshd import SshdFactory, SshServer

from orbit.core.execution.ssh.transport import options_for
from orbit.model.config import Settings


def add_host(env: dict[str, str], name: str, server: SshServer, *extra: str) -> dict[str, Any]:
    return dict(
        orbit_json(
            env,
            "hosts",
            "add",
            name,
            "--ssh",
            server.alias,
            "--work-dir",
            str(server.work_root),
            *extra,
        )
    )


def spec_for(folder: Path, target: str, command: str, **fields: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return write_spec(
        folder,
        template="targon-rental-host",
        task={"command": command},
        overrides={"target": target, "resources": {"gpu_count": 0}},
        **fields,
    )


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("orbit: error: ")
    return lines[0]


# --- the hosts registry ------------------------------------------------------------------------


def test_hosts_add_checks_and_records_what_the_host_has(
    env: dict[str, str], sshd_factory: SshdFactory
) -> None:
    server = sshd_factory(alias="h100-a")
    added = add_host(env, "h100-a", server)
    facts = added["facts"]
    assert facts["python_path"] and facts["python_version"].startswith("3.")
    assert facts["gpus"] == []  # no GPU here: nvidia-smi absent
    assert facts["disk_free_bytes"] > 0
    assert facts["work_dir"] == str(server.work_root)
    assert facts["rsync"] is True
    assert [h["spec"]["name"] for h in orbit_json(env, "hosts", "list")] == ["h100-a"]
    shown = orbit(env, "hosts", "show", "h100-a").stdout
    assert "python3:" in shown and "gpus:" in shown and "none (no nvidia-smi)" in shown
    rechecked = orbit_json(env, "hosts", "check", "h100-a")
    assert rechecked["facts"]["checked_at"] >= facts["checked_at"]
    again = orbit(env, "hosts", "add", "h100-a", "--ssh", server.alias, check=False)
    assert "already exists" in one_line_error(again)
    orbit(env, "hosts", "remove", "h100-a")
    assert orbit_json(env, "hosts", "list") == []
    actions = [e["action"] for e in orbit_json(env, "audit")]
    assert actions == ["host.added", "host.checked", "host.removed"]


def test_bad_keys_and_unknown_host_keys_are_refused_with_what_to_do(
    env: dict[str, str], sshd_factory: SshdFactory
) -> None:
    server = sshd_factory(alias="box")
    # the key the user's ssh config names is not one the host accepts
    wrong_env = {**env, "ORBIT_SSH_CONFIG": str(server.wrong_identity_config())}
    wrong = orbit(wrong_env, "hosts", "add", "box", "--ssh", server.alias, check=False)
    assert "refused the key" in one_line_error(wrong) and "--identity" in wrong.stderr
    unknown_env = {**env, "ORBIT_SSH_CONFIG": str(server.unknown_host_key_config())}
    unknown = orbit(unknown_env, "hosts", "add", "box", "--ssh", server.alias, check=False)
    line = one_line_error(unknown)
    assert (
        "host key is unknown" in line and "ssh-keyscan" in line and "--accept-new-host-key" in line
    )
    assert orbit_json(env, "hosts", "list") == []  # nothing half-written
    # trusting a first-seen key is possible, but only when asked for by name
    added = orbit_json(
        unknown_env, "hosts", "add", "box", "--ssh", server.alias, "--accept-new-host-key"
    )
    assert added["spec"]["accept_new_host_key"] is True
    dead = orbit(env, "hosts", "add", "gone", "--ssh", "root@127.0.0.1", "--port", "9", check=False)
    assert "unreachable" in one_line_error(dead) and dead.returncode == 3


def test_a_host_without_python3_is_shown_and_refused_before_staging(
    env: dict[str, str], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    from tests.sshd import make_tool_dir

    tools = make_tool_dir(tmp_path / "no-python-bin")
    server = sshd_factory(alias="bare", path=str(tools))
    added = add_host(env, "bare", server)
    assert added["facts"]["python_path"] is None
    assert "MISSING" in orbit(env, "hosts", "show", "bare").stdout
    refused = orbit(env, "submit", str(spec_for(tmp_path / "job", "bare", "echo hi")), check=False)
    assert "has no python3" in one_line_error(refused)
    assert orbit_json(env, "runs", "list") == []


def test_gpu_requests_beyond_what_the_host_reported_are_refused(
    env: dict[str, str], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    add_host(env, "h100-a", sshd_factory(alias="h100-a"))
    spec = spec_for(tmp_path / "job", "h100-a", "echo hi")
    refused = orbit(env, "submit", str(spec), "--set", "resources.gpu_count=2", check=False)
    line = one_line_error(refused)
    assert "reported 0 GPUs" in line and "asks for 2" in line
    assert orbit_json(env, "runs", "list") == []
    unknown = orbit(env, "submit", str(spec), "--set", "target=nowhere", check=False)
    assert "not a registered host" in one_line_error(unknown)


# --- a run on a host --------------------------------------------------------------------------


def test_a_run_on_an_ssh_host_stages_runs_detached_follows_and_collects(
    env: dict[str, str], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    server = sshd_factory(alias="h100-a")
    add_host(env, "h100-a", server)
    job = tmp_path / "job"
    (job / "code").mkdir(parents=True)
    (job / "code" / "data.bin").write_bytes(os.urandom(200_000))
    command = (
        'echo "on $(hostname) in $PWD"; sleep 1; mkdir -p "$ORBIT_ARTIFACTS_DIR/ckpt"; '
        'head -c 300000 data.bin > "$ORBIT_ARTIFACTS_DIR/ckpt/step-1.bin"; echo done'
    )
    spec = write_spec(
        job,
        template="targon-rental-host",
        task={"command": command, "workdir": "code"},
        overrides={"target": "h100-a", "resources": {"gpu_count": 0}},
    )
    run = orbit_json(env, "submit", str(spec))
    handle = run["attempts"][0]["handle"]
    location = Path(handle["location"])
    assert location.parent == server.work_root / "attempts"
    assert handle["data"]["staged_bytes"] >= 200_000 and handle["data"]["bundle_cached"] is False
    # the wrapper runs in a new session whose leader is gone: nothing ties it to the SSH
    # session that started it, which has ended
    pid = int((location / "runtime" / "pid").read_text())
    assert os.getsid(pid) != os.getsid(0) and not psutil.pid_exists(os.getsid(pid))
    # and submit left no SSH connection behind (not even the shared one, idling)
    settings = Settings(home=Path(env["ORBIT_HOME"]).absolute(), database_url="")
    control = str(options_for(settings).control_path().parent)
    assert not [
        p for p in psutil.process_iter(["cmdline"]) if control in " ".join(p.info["cmdline"] or [])
    ]
    followed = orbit(env, "logs", run["id"], "--follow")
    assert followed.stdout.splitlines()[-1] == "done"
    assert f"in {location}/inputs/workdir" in followed.stdout
    shown = orbit_json(env, "status", run["id"])
    assert shown["state"] == "succeeded" and shown["attempts"][0]["target"] == "h100-a"
    assert "wrapper started" in orbit(env, "logs", run["id"], "--layer", "runtime").stdout
    dest = tmp_path / "collected"
    first = orbit_json(env, "collect", run["id"], "--dest", str(dest))
    assert first["verified"] is True and first["problems"] == []
    assert (dest / "ckpt" / "step-1.bin").stat().st_size == 200_000
    second = orbit_json(env, "collect", run["id"], "--dest", str(dest))
    assert second["verified"] is True and second["moved"] == 0  # incremental: nothing moved
    # the bundle cache on the host holds the frozen parts only
    cached = server.work_root / "bundles" / run["bundle"]["digest"]
    assert sorted(p.name for p in cached.iterdir()) == [
        ".orbit-complete",
        "inputs",
        "job.json",
        "scripts",
    ]


def test_a_retry_elsewhere_pushes_the_same_bundle_without_the_dead_attempts_files(
    env: dict[str, str], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    a, b = sshd_factory(alias="h100-a"), sshd_factory(alias="h100-b")
    add_host(env, "h100-a", a)
    add_host(env, "h100-b", b)
    command = (  # the first attempt fails, any later one succeeds
        'echo "attempt $ORBIT_ATTEMPT_ID" > "$ORBIT_ARTIFACTS_DIR/who.txt"; '
        'test "$ORBIT_ATTEMPT_ID" != "${ORBIT_RUN_ID}-1"'
    )
    spec = spec_for(tmp_path / "job", "h100-a", command, retry={"max_retries": 0})
    run = json.loads(orbit(env, "submit", str(spec), "--wait", "--json", check=False).stdout)
    assert run["state"] == "failed" and run["attempts"][0]["reason"] == "task_exit_nonzero"
    retried = orbit_json(env, "retry", run["id"], "--set", "target=h100-b", "--wait")
    assert retried["state"] == "succeeded"
    assert retried["bundle"]["digest"] == run["bundle"]["digest"]
    second = retried["attempts"][1]
    assert second["target"] == "h100-b" and second["handle"]["data"]["bundle_cached"] is False
    where = Path(second["handle"]["location"])
    assert where.parent == b.work_root / "attempts"
    assert (where / "artifacts" / "who.txt").read_text() == f"attempt {run['id']}-2\n"
    assert "task_exit_nonzero" not in (where / "runtime" / "runtime.log").read_text()
    # pushing the unchanged bundle to h100-b again sends nothing
    again = orbit_json(env, "replay", run["id"], "--set", "target=h100-b")
    data = again["attempts"][0]["handle"]["data"]
    assert data["bundle_cached"] is True and data["staged_bytes"] == 0


def test_a_hosts_cached_bundle_changed_since_staging_is_never_run_and_is_staged_again(
    env: dict[str, str], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    """Tasks of every user of a rental host run as its one login: a task can rewrite the
    host's cached copy of another run's bundle. The next launch checks the copy it makes
    against the digest: the attempt fails staging (naming the change), the copy leaves the
    cache, and the automatic retry stages the frozen bundle again and runs it."""
    server = sshd_factory(alias="h100-a")
    add_host(env, "h100-a", server)
    spec = spec_for(
        tmp_path / "job", "h100-a", "echo original", retry={"max_retries": 2, "backoff_s": 0}
    )
    run = orbit_json(env, "submit", str(spec), "--wait")
    assert run["state"] == "succeeded"
    cached = server.work_root / "bundles" / run["bundle"]["digest"]
    job = json.loads((cached / "job.json").read_text())
    job["entrypoint"] = ["bash", "-c", "echo PWNED"]
    (cached / "job.json").write_text(json.dumps(job))
    again = orbit_json(env, "retry", run["id"], "--wait")
    second, third = again["attempts"][1], again["attempts"][2]
    assert (second["state"], second["reason"]) == ("failed", "staging_failed"), second
    assert "was changed after it was staged" in second["message"]
    assert third["state"] == "succeeded" and third["handle"]["data"]["bundle_cached"] is False
    assert orbit(env, "logs", run["id"]).stdout == "original\n"


def test_cancel_stops_the_remote_process_group(
    env: dict[str, str], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    server = sshd_factory(alias="h100-a")
    add_host(env, "h100-a", server)
    run = orbit_json(env, "submit", str(spec_for(tmp_path / "job", "h100-a", "echo up; sleep 300")))
    location = Path(run["attempts"][0]["handle"]["location"])
    eventually(lambda: orbit_json(env, "status", run["id"])["state"] == "running")
    task_pid = json.loads((location / "runtime" / "status.json").read_text())["task_pid"]
    cancelled = orbit_json(env, "cancel", run["id"])
    assert cancelled["state"] == "terminated"
    assert cancelled["attempts"][0]["reason"] == "cancelled"
    with pytest.raises(ProcessLookupError):
        os.killpg(task_pid, 0)


def test_a_full_disk_during_staging_fails_the_attempt_before_it_starts(
    env: dict[str, str], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    server = sshd_factory(alias="small")
    small = tmp_path / "small-disk"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True)
    try:
        orbit_json(env, "hosts", "add", "small", "--ssh", server.alias, "--work-dir", str(small))
        job = tmp_path / "job"
        (job / "code").mkdir(parents=True)
        (job / "code" / "weights.bin").write_bytes(os.urandom(3_000_000))
        spec = write_spec(
            job,
            template="targon-rental-host",
            task={"command": "echo never", "workdir": "code"},
            overrides={"target": "small", "resources": {"gpu_count": 0}},
            retry={"max_retries": 0},
        )
        run = orbit_json(env, "submit", str(spec))
        attempt = run["attempts"][0]
        assert run["state"] == "failed" and attempt["reason"] == "staging_failed"
        assert "no space left" in attempt["message"] and attempt["started_at"] is None
        assert attempt["handle"] is None  # never recorded as started
        assert not list((small / "bundles").iterdir())  # the partial transfer was removed
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


# --- hosts that vanish ------------------------------------------------------------------------


def test_a_vanished_host_is_unreachable_then_terminated_after_its_timeout(
    env: dict[str, str], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    server = sshd_factory(alias="flaky", netns=True)
    add_host(env, "flaky", server, "--unreachable-timeout", "8")
    spec = spec_for(tmp_path / "job", "flaky", "sleep 300", retry={"max_retries": 0})
    run = orbit_json(env, "submit", str(spec))
    eventually(lambda: orbit_json(env, "status", run["id"])["state"] == "running")
    server.link_down()
    seen = orbit_json(env, "status", run["id"])
    attempt = seen["attempts"][0]
    assert seen["state"] == "running"  # kept: unreachable is not failed
    assert attempt["reason"] == "host_unreachable" and attempt["last_contact_at"]
    text = orbit(env, "status", run["id"]).stdout
    assert "host_unreachable" in text and "last contact" in text
    ended = eventually(
        lambda: (r := orbit_json(env, "status", run["id"]))["state"] == "terminated" and r,
        timeout=40,
        every=1,
    )
    assert ended["attempts"][0]["reason"] == "host_unreachable"
    assert "unreachable for" in ended["attempts"][0]["message"]
    actions = [e["action"] for e in orbit_json(env, "audit", "--run", run["id"])]
    assert actions.count("host.unreachable") == 1


def test_a_run_outlives_a_network_drop_and_logs_follow_resumes(
    env: dict[str, str], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    server = sshd_factory(alias="flaky", netns=True)
    add_host(env, "flaky", server)
    command = "for i in $(seq 1 30); do echo line $i; sleep 0.5; done"
    run = orbit_json(env, "submit", str(spec_for(tmp_path / "job", "flaky", command)))
    errors = tmp_path / "follow.err"
    with open(errors, "w") as err_file:
        follower = subprocess.Popen(
            [*ORBIT, "logs", run["id"], "--follow"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=err_file,
            text=True,
        )
    try:
        time.sleep(2)
        server.link_down()  # until the follower has noticed, however slow this machine is
        eventually(lambda: "unreachable" in errors.read_text(), timeout=60, every=0.2)
        server.link_up()
        out, _ = follower.communicate(timeout=120)
    finally:
        if follower.poll() is None:
            follower.send_signal(signal.SIGINT)
    assert out.splitlines() == [f"line {i}" for i in range(1, 31)]  # complete, once each
    assert "reconnected" in errors.read_text()
    assert orbit_json(env, "status", run["id"])["state"] == "succeeded"


def test_an_interrupted_collect_continued_moves_only_what_is_missing(
    env: dict[str, str], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    add_host(env, "h100-a", sshd_factory(alias="h100-a"))
    size = 200_000_000
    command = f'head -c {size} /dev/urandom > "$ORBIT_ARTIFACTS_DIR/step-1.pt"'
    spec = spec_for(tmp_path / "job", "h100-a", command)
    run = json.loads(orbit(env, "submit", str(spec), "--wait", "--json").stdout)
    dest = tmp_path / "collected"
    collecting = subprocess.Popen(
        [*ORBIT, "collect", run["id"], "--dest", str(dest)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )

    def arrived() -> int:
        return sum(p.stat().st_size for p in dest.rglob("*") if p.is_file()) if dest.exists() else 0

    eventually(lambda: arrived() > size // 10, timeout=60, every=0.01)
    os.killpg(collecting.pid, signal.SIGINT)  # Ctrl-C: rsync keeps what arrived (--partial)
    collecting.communicate(timeout=30)
    assert collecting.returncode != 0
    kept = (dest / "step-1.pt").stat().st_size
    assert 0 < kept < size
    resumed = orbit_json(env, "collect", run["id"], "--dest", str(dest))
    assert resumed["verified"] is True and resumed["problems"] == []
    # only the missing part moved (give or take one of rsync's blocks, ~sqrt(size) bytes)
    assert resumed["moved"] <= size - kept + (1 << 16)
    assert (dest / "step-1.pt").stat().st_size == size


def test_a_cancel_while_the_host_is_away_is_delivered_when_it_answers(
    env: dict[str, str], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    server = sshd_factory(alias="flaky", netns=True)
    add_host(env, "flaky", server)
    run = orbit_json(env, "submit", str(spec_for(tmp_path / "job", "flaky", "sleep 300")))
    eventually(lambda: orbit_json(env, "status", run["id"])["state"] == "running")
    location = Path(run["attempts"][0]["handle"]["location"])
    server.link_down()
    asked = orbit_json(env, "cancel", run["id"])
    attempt = asked["attempts"][0]
    assert asked["state"] == "running" and attempt["cancel_requested"] is True
    assert attempt["reason"] == "host_unreachable" and "cancel requested" in attempt["message"]
    assert not (location / "runtime" / "stop_request.json").exists()  # it did not get there
    server.link_up()
    ended = eventually(
        lambda: (r := orbit_json(env, "status", run["id"]))["state"] == "terminated" and r,
        timeout=60,
        every=1,
    )
    assert ended["attempts"][0]["reason"] == "cancelled"
    assert len(ended["attempts"]) == 1  # a cancelled attempt is not retried


def test_an_automatic_retry_to_a_removed_host_fails_instead_of_hanging(
    env: dict[str, str], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    add_host(env, "h100-a", sshd_factory(alias="h100-a"))
    spec = spec_for(
        tmp_path / "job", "h100-a", "sleep 300", retry={"max_retries": 1, "backoff_s": 0}
    )
    run = orbit_json(env, "submit", str(spec))
    eventually(lambda: orbit_json(env, "status", run["id"])["state"] == "running")
    orbit(env, "hosts", "remove", "h100-a")
    # the box loses the wrapper: an infrastructure failure, so a retry is due, to a host that
    # is no longer registered; the run still reads back through the handle's own copy
    location = Path(run["attempts"][0]["handle"]["location"])
    os.kill(int((location / "runtime" / "pid").read_text()), signal.SIGKILL)
    ended = eventually(
        lambda: (r := orbit_json(env, "status", run["id"]))["state"] == "failed" and r
    )
    first, second = ended["attempts"]
    assert first["reason"] == "runtime_lost"
    assert second["trigger"] == "auto_retry" and second["reason"] == "launch_failed"
    assert "not a registered host" in second["message"]


# --- nothing of an ended attempt keeps running ------------------------------------------------

ESCAPING = 'setsid sleep 300 & echo $! > "$ORBIT_ARTIFACTS_DIR/escaped.pid"; sleep 300'
NO_RETRY = {"max_retries": 0}


def task_processes(env: dict[str, str], run_id: str) -> list[int]:
    """The attempt's wrapper, its task and the child that left the task's process group."""
    location = Path(orbit_json(env, "runs", "show", run_id)["attempts"][0]["handle"]["location"])
    escaped = eventually(lambda: (location / "artifacts" / "escaped.pid").exists())
    assert escaped
    status = json.loads((location / "runtime" / "status.json").read_text())
    return [
        int((location / "runtime" / "pid").read_text()),
        int(status["task_pid"]),
        int((location / "artifacts" / "escaped.pid").read_text()),
    ]


def test_an_attempt_given_up_on_is_stopped_by_cancel_and_by_the_hosts_next_contact(
    env: dict[str, str], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    """A host that went away: its runs ended as terminated (host_unreachable), but their tasks
    went on there. Once the host answers again nothing of them is left running: `orbit cancel`
    of an ended run stops what is left of it, and the next look that reaches the host stops
    the rest."""
    from tests.helpers import process_alive

    server = sshd_factory(alias="flaky", netns=True)
    add_host(env, "flaky", server, "--unreachable-timeout", "4")
    add_host(env, "flaky-too", server)  # the same box under another name: 600 s to wait out
    given_up = [
        orbit_json(env, "submit", str(spec_for(tmp_path / n, "flaky", ESCAPING, retry=NO_RETRY)))[
            "id"
        ]
        for n in ("a", "c")
    ]
    kept = orbit_json(env, "submit", str(spec_for(tmp_path / "b", "flaky-too", ESCAPING)))["id"]
    for run_id in (*given_up, kept):
        eventually(lambda r=run_id: orbit_json(env, "status", r)["state"] == "running", 60)
    processes = {run_id: task_processes(env, run_id) for run_id in (*given_up, kept)}

    server.link_down()
    assert orbit_json(env, "status", kept)["state"] == "running"  # its clock starts: 600 s
    for run_id in given_up:
        ended = eventually(
            lambda r=run_id: (s := orbit_json(env, "status", r))["state"] == "terminated" and s,
            timeout=60,
            every=0.5,
        )
        assert ended["attempts"][0]["reason"] == "host_unreachable"
    assert all(process_alive(p) for pids in processes.values() for p in pids)  # they go on
    server.link_up()

    first, second = given_up
    out = orbit(env, "cancel", first).stdout
    assert re.search(rf"^{first} already terminated; stopped \d+ leftover processes$", out), out
    assert not any(process_alive(p) for p in processes[first])
    assert all(process_alive(p) for p in processes[second])  # that run's only
    assert "nothing to cancel" in orbit(env, "cancel", first).stdout

    looked = orbit_json(env, "status", kept)  # the next look that reaches the host
    assert looked["state"] == "running" and looked["attempts"][0]["reason"] is None
    assert not any(process_alive(p) for p in processes[second])
    assert all(process_alive(p) for p in processes[kept])  # a live attempt is never touched
    actions = [e["action"] for e in orbit_json(env, "audit")]
    assert "run.leftovers_stopped" in actions and "host.processes_stopped" in actions
    orbit(env, "cancel", kept)


def test_hosts_check_and_the_next_launch_stop_ended_attempts_and_nothing_else(
    env: dict[str, str], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    """The store says an attempt ended (given up on, say) while the host still runs it: `orbit
    hosts check` stops it, and so does the next launch there. A live attempt, and another
    control plane's attempts in the same work dir, are never touched."""
    from tests.helpers import process_alive

    from orbit.model.models import FailureReason, RunState
    from orbit.store import Store

    server = sshd_factory(alias="h100-a")
    add_host(env, "h100-a", server)
    other_home = tmp_path / "other-home"
    other_home.mkdir()
    other = {  # a colleague's control plane, the same box and work dir
        **env,
        "ORBIT_HOME": str(other_home),
        "ORBIT_DATABASE_URL": f"sqlite:///{other_home / 'orbit.db'}",
    }
    add_host(other, "h100-a", server)
    theirs = orbit_json(other, "submit", str(spec_for(tmp_path / "theirs", "h100-a", ESCAPING)))
    runs = [
        orbit_json(env, "submit", str(spec_for(tmp_path / n, "h100-a", ESCAPING)))
        for n in ("ended-1", "ended-2", "live")
    ]
    processes = {r["id"]: task_processes(env, r["id"]) for r in runs}
    processes[theirs["id"]] = task_processes(other, theirs["id"])

    def give_up(run: dict[str, Any]) -> None:
        """As the service does when the host has not answered for its timeout."""
        store = Store(env["ORBIT_DATABASE_URL"])
        try:
            store.attempts.move_attempt(
                run["attempts"][0]["id"],
                RunState.TERMINATED,
                actor="tester",
                reason=FailureReason.HOST_UNREACHABLE,
            )
        finally:
            store.close()

    first, second, live = runs
    give_up(first)
    checked = orbit_json(env, "hosts", "check", "h100-a")
    assert list(checked["stopped_processes"]) == [first["attempts"][0]["id"]]
    assert not any(process_alive(p) for p in processes[first["id"]])
    give_up(second)
    assert all(process_alive(p) for p in processes[second["id"]])
    orbit_json(env, "submit", str(spec_for(tmp_path / "next", "h100-a", "true")))
    assert not any(process_alive(p) for p in processes[second["id"]])
    stopped = [e for e in orbit_json(env, "audit") if e["action"] == "host.processes_stopped"]
    # one at the check, one at the launch: each sweep that stopped something is audited
    assert [e["data"]["attempts"] for e in stopped] == [
        [first["attempts"][0]["id"]],
        [second["attempts"][0]["id"]],
    ]
    for untouched in (live["id"], theirs["id"]):
        assert all(process_alive(p) for p in processes[untouched]), untouched
    orbit(env, "cancel", live["id"])
    orbit(other, "cancel", theirs["id"])


# --- reading logs -----------------------------------------------------------------------------


def test_a_whole_log_comes_in_one_ssh_call_byte_for_byte_with_its_offsets(
    env: dict[str, str], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    import shutil
    import stat

    from orbit.core.execution.backends.base import LogLayer
    from orbit.core.execution.backends.ssh_host_process import NoHosts, SshHostProcessBackend
    from orbit.model.models import RunHandle

    add_host(env, "h100-a", sshd_factory(alias="h100-a"))
    size = 5_000_000  # five of read_log's chunks; binary, every byte value
    spec = spec_for(tmp_path / "job", "h100-a", f"head -c {size} /dev/urandom")
    run = json.loads(orbit(env, "submit", str(spec), "--wait", "--json").stdout)
    handle = RunHandle.model_validate(run["attempts"][0]["handle"])
    log = (Path(handle.location) / "artifacts" / "training.log").read_bytes()
    assert len(log) == size

    calls = tmp_path / "ssh-calls"
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "ssh").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {shutil.which("ssh")} "$@"\n')
    (shim / "ssh").chmod(stat.S_IRWXU)
    counted = {**env, "PATH": f"{shim}{os.pathsep}{env['PATH']}"}
    shown = subprocess.run(
        [*ORBIT, "logs", run["id"]], env=counted, capture_output=True, timeout=120, check=True
    )
    assert shown.stdout == log
    # a chunk over the shared connection, then the rest in one call, not one per MiB
    assert len(calls.read_text().splitlines()) == 2
    last = subprocess.run(
        [*ORBIT, "logs", run["id"], "--tail", "2"], env=counted, capture_output=True, check=True
    )  # the log's end found in one call that reads 64 KiB of it, then read in one more
    assert last.stdout == log[log.rindex(b"\n", 0, log.rindex(b"\n", 0, size - 1)) + 1 :]
    assert len(calls.read_text().splitlines()) == 4

    settings = Settings(
        home=Path(env["ORBIT_HOME"]).absolute(),
        database_url="",
        ssh_config=Path(env["ORBIT_SSH_CONFIG"]),
    )
    backend = SshHostProcessBackend(NoHosts(), options_for(settings))
    got = bytearray()
    end = backend.stream_log(handle, LogLayer.TRAINING, 1234, got.extend)
    assert end == size and bytes(got) == log[1234:]
    assert backend.stream_log(handle, LogLayer.TRAINING, end, got.extend) == end  # nothing new
    data, after = backend.read_log(handle, LogLayer.TRAINING, 1234)  # the same offsets
    assert after == 1234 + len(data) and data == log[1234:after]
    assert backend.read_log_end(handle, LogLayer.TRAINING, 100) == (log[-100:], size)
    gone = handle.model_copy(update={"location": f"{handle.location}-never"})
    assert backend.stream_log(gone, LogLayer.TRAINING, 0, got.extend) == 0  # not written yet
    assert backend.read_log_end(gone, LogLayer.TRAINING, 100) == (b"", 0)


def test_retries_to_a_host_that_is_away_wait_for_it_instead_of_burning_out(
    env: dict[str, str], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    """A launch whose host does not answer is not a failure that uses up a retry: the attempt
    waits (prepared, host_unreachable) and is launched when the host answers. Past the host's
    timeout it ends as a running attempt would (terminated, host_unreachable), and the next
    retry comes after its backoff, not at once."""
    server = sshd_factory(alias="flaky", netns=True)
    # long enough that the looks below (each launch try waits out the 2 s ssh timeout, twice:
    # the leftover sweep, then staging) stay well inside it even on a slow machine
    add_host(env, "flaky", server, "--unreachable-timeout", "15")
    server.link_down()
    spec = spec_for(
        tmp_path / "job", "flaky", "echo done", retry={"max_retries": 2, "backoff_s": 1}
    )
    run = orbit_json(env, "submit", str(spec))
    assert run["state"] == "prepared"
    first = run["attempts"][0]
    assert first["reason"] == "host_unreachable" and first["handle"] is None
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # looking again and again spends no retry
        seen = orbit_json(env, "status", run["id"])
        assert len(seen["attempts"]) == 1 and seen["state"] == "prepared"
        time.sleep(0.5)
    assert "waiting for its host" in orbit(env, "status", run["id"]).stdout
    second = eventually(
        lambda: len((r := orbit_json(env, "status", run["id"]))["attempts"]) == 2 and r,
        timeout=60,
        every=0.5,
    )
    gave_up = second["attempts"][0]
    assert (gave_up["state"], gave_up["reason"]) == ("terminated", "host_unreachable")
    assert second["attempts"][1]["trigger"] == "auto_retry"
    server.link_up()
    done = eventually(
        lambda: (r := orbit_json(env, "status", run["id"]))["state"] == "succeeded" and r,
        timeout=60,
        every=0.5,
    )
    assert len(done["attempts"]) == 2  # one retry used, not all of them in a second
