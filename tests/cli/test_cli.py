"""The `orbit` command as a user runs it: a real process, its exit code, stdout and stderr.
Every test runs twice: embedded (the store in the CLI's own process) and against a real
`orbit server` process on loopback (ORBIT_SERVER, ORBIT_TOKEN), where it must behave the same:
same output, same --json, same exit codes, same one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orbit.store import Store
from tests.helpers import eventually, write_spec
from tests.orbit_server import Server

ORBIT = [sys.executable, "-m", "orbit"]


@pytest.fixture(params=["embedded", "server"])
def env(request: pytest.FixtureRequest, orbit_home: Path, store_url: str) -> dict[str, str]:
    embedded = {
        **os.environ,
        "ORBIT_HOME": str(orbit_home),
        "ORBIT_DATABASE_URL": store_url,
        "COLUMNS": "200",
    }
    if request.param == "embedded":
        return embedded
    server: Server = request.getfixturevalue("orbit_server")
    # through a server the CLI opens no store of its own: this one must never come to exist
    never = orbit_home.parent / "never" / "not-used.db"
    request.addfinalizer(lambda: _never_made(never))
    # (the tests look into the server's own store: TEST_STORE_URL)
    return {
        **server.env(),
        "ORBIT_DATABASE_URL": f"sqlite:///{never}",
        "TEST_STORE_URL": server.database_url,
    }


def store_of(env: dict[str, str]) -> Store:
    """The store the commands in `env` write: the server's, or the embedded one."""
    return Store(env.get("TEST_STORE_URL") or env["ORBIT_DATABASE_URL"])


def _never_made(path: Path) -> None:
    assert not path.parent.exists(), f"a CLI through the server opened {path}"


def orbit(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*ORBIT, *args], env=env, capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"orbit {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def orbit_json(env: dict[str, str], *args: str) -> Any:
    proc = orbit(env, *args, "--json")
    return json.loads(proc.stdout)  # JSON only, nothing else on stdout


def test_submit_runs_detached_and_everything_reads_back(
    env: dict[str, str], tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, task={"command": "echo started; sleep 1; echo finished"})
    submitted = orbit_json(env, "submit", str(spec))
    run_id = submitted["id"]
    # the CLI has exited; the run goes on without it
    # launched; a server's loop may already have seen it start
    assert submitted["state"] in {"submitted", "starting", "running"}
    followed = orbit(env, "logs", run_id, "--follow")
    assert followed.stdout == "started\nfinished\n"
    shown = orbit_json(env, "runs", "show", run_id)
    assert shown["state"] == "succeeded"
    assert len(shown["bundle"]["digest"]) == 64
    assert shown["attempts"][0]["id"] == f"{run_id}-1"
    assert shown["attempts"][0]["target"] == "localhost"
    assert orbit_json(env, "status", run_id)["state"] == "succeeded"
    assert "wrapper started" in orbit(env, "logs", run_id, "--layer", "runtime").stdout
    listed = orbit_json(env, "runs", "list", "--experiment", "exp", "--state", "succeeded")
    assert [r["id"] for r in listed] == [run_id]
    assert orbit_json(env, "runs", "list", "--state", "failed") == []
    collected = orbit_json(env, "collect", run_id, "--dest", str(tmp_path / "out"))
    assert collected["verified"] is True
    assert (tmp_path / "out" / "training.log").read_text() == "started\nfinished\n"
    # what was collected tells its run without the store; so does the bundle's last run
    source = {
        "run_id": run_id,
        "attempt_id": f"{run_id}-1",
        "bundle_digest": shown["bundle"]["digest"],
        "template": shown["template_id"],
    }
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["run"] == source
    location = Path(shown["attempts"][0]["handle"]["location"])
    last = json.loads((location / "runtime" / "last_run.json").read_text())
    assert {k: last[k] for k in source} == source and last["exit_code"] == 0
    assert last["handle"]["backend"] == "local_host_process"
    events = orbit_json(env, "audit", "--run", run_id)
    assert {"run.created", "run.submitted", "attempt.state", "run.collected"} <= {
        e["action"] for e in events
    }
    assert [e["name"] for e in orbit_json(env, "experiments", "list")] == ["exp"]
    human = orbit(env, "runs", "show", run_id[:10]).stdout  # a unique prefix is enough
    assert run_id in human and "succeeded" in human


def test_submit_wait_exits_non_zero_when_the_run_fails(env: dict[str, str], tmp_path: Path) -> None:
    spec = write_spec(tmp_path, task={"command": "exit 4"})
    proc = orbit(env, "submit", str(spec), "--wait", "--json", check=False)
    assert proc.returncode == 1
    run = json.loads(proc.stdout)
    assert run["state"] == "failed"
    assert run["attempts"][0]["reason"] == "task_exit_nonzero"
    assert run["attempts"][0]["failure_kind"] == "task"
    assert run["attempts"][0]["exit_code"] == 4


def test_cancel_and_retry(env: dict[str, str], tmp_path: Path) -> None:
    spec = write_spec(tmp_path, task={"command": "sleep 30"})
    run_id = orbit_json(env, "submit", str(spec))["id"]
    cancelled = orbit_json(env, "cancel", run_id)
    assert cancelled["state"] == "terminated"
    assert cancelled["attempts"][0]["reason"] == "cancelled"
    assert "nothing to cancel" in orbit(env, "cancel", run_id).stdout
    retried = orbit_json(env, "retry", run_id)
    assert [a["trigger"] for a in retried["attempts"]] == ["submit", "retry"]
    assert retried["bundle"]["digest"] == cancelled["bundle"]["digest"]
    orbit(env, "cancel", run_id)


def test_templates_and_experiments(env: dict[str, str], tmp_path: Path) -> None:
    ids = [t["id"] for t in orbit_json(env, "templates", "list")]
    assert {"local", "targon-rental-host"} <= set(ids)
    shown = orbit_json(env, "templates", "show", "targon-rental-host")
    assert shown["placement"]["kind"] == "targon_rental"
    assert shown["canonical_placement"] == "ssh"
    assert shown["path"].endswith("targon-rental-host.yaml")
    # piped, `templates show` prints the file as written, with where it came from as comments:
    # valid YAML whatever its line lengths
    raw = orbit(env, "templates", "show", "targon-rental-host").stdout
    assert "# placement 'targon_rental' is accepted as another name for 'ssh'" in raw
    assert yaml.safe_load(raw) == yaml.safe_load(Path(shown["path"]).read_text(encoding="utf-8"))
    long = "x" * 300
    (tmp_path / "execution_templates").mkdir()
    (tmp_path / "execution_templates" / "wide.yaml").write_text(
        f"id: wide\ndescription: {long}\nplacement: {{kind: local}}\n"
        "launch_mode: {kind: host_process}\n"
    )
    assert yaml.safe_load(orbit(env, "templates", "show", "wide").stdout)["description"] == long
    user_dir = tmp_path / "execution_templates"  # the tests run with tmp_path as cwd
    (user_dir / "local.yaml").write_text(
        "id: local\nplacement: {kind: local}\nlaunch_mode: {kind: host_process}\n"
    )
    assert orbit_json(env, "templates", "show", "local")["path"] == str(user_dir / "local.yaml")
    assert "from " + str(user_dir / "local.yaml") in orbit(env, "templates", "show", "local").stdout
    created = orbit_json(env, "experiments", "create", "sweep-1")
    assert created["name"] == "sweep-1"
    assert orbit(env, "experiments", "create", "sweep-1", check=False).returncode == 2


CMD = "experiment: e\ntask_type: command\ntemplate: local\ntask: {command: x}\n"
PY = "experiment: e\ntask_type: python\ntemplate: local\n"
BAD_SPECS = {
    "invalid YAML": ("experiment: [unclosed\n", r"spec.yaml: invalid YAML at line 2"),
    "not a mapping": ("- a\n- b\n", r"spec.yaml: expected a mapping at the top level"),
    "unknown key": (CMD + "foo: 1\n", r"spec.yaml: foo: unknown key"),
    "wrong type": (
        CMD + "retry: {max_retries: lots}\n",
        r"spec.yaml: retry.max_retries: Input should be a valid integer",
    ),
    "missing field": (PY, r"spec.yaml: task: Field required"),
    "bad task field": (
        PY + "task: {script: train.py, args: 5}\n",
        r"spec.yaml: task.args: Input should be a valid list",
    ),
    "missing script": (
        PY + "task: {script: nowhere.py}\n",
        r"task.script: no such file: .*nowhere",
    ),
    "override outside whitelist": (
        CMD + "overrides: {target: h1}\n",
        r"override 'target' is not allowed by template 'local' "
        r"\(allow_overrides: resources, runtime_env, secrets, stop_grace_s\)",
    ),
    "unknown override field": (
        CMD + "overrides: {resources: {gpus: 2}}\n",
        r"spec.yaml: overrides: resources.gpus: unknown key",
    ),
    "unknown template": (
        CMD.replace("local", "nope"),
        r"unknown template 'nope' \(known: local, local-docker, .*targon-rental-host\)",
    ),
    "unregistered host": (
        CMD.replace("local", "targon-rental-host") + "overrides: {target: h100-a}\n",
        r"target 'h100-a' is not a registered host \(see 'orbit hosts list'",
    ),
    "no target host": (
        CMD.replace("local", "targon-rental-host"),
        r"template 'targon-rental-host' runs on a registered SSH host: give one with "
        r"--set target=NAME",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    env: dict[str, str], tmp_path: Path, case: str
) -> None:
    import re

    text, expected = BAD_SPECS[case]
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    proc = orbit(env, "submit", str(spec), check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orbit: error: "), proc.stderr
    assert re.search(expected, lines[0]), lines[0]
    assert proc.stdout == ""
    store = store_of(env)
    try:
        assert store.runs.list_runs() == [] and store.experiments.list_experiments() == []
        # (a server's own first start is in its trail: its admin and that admin's token)
        assert [e.action for e in store.audit.list_events() if e.actor != "orbit-server"] == []
    finally:
        store.close()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["submit", "missing.yaml"], r"missing.yaml: no such file"),
        (["submit", "spec.yaml", "--set", "novalue"], r"--set 'novalue': expected key=value"),
        (["status", "run-0000000000"], r"unknown run 'run-0000000000'"),
        (["logs", "run-nope"], r"unknown run 'run-nope'"),
        (["runs", "list", "--state", "sleeping"], r"--state: unknown state 'sleeping'"),
        (["runs", "list", "--experiment", "ghost"], r"unknown experiment 'ghost'"),
        (["templates", "show", "ghost"], r"unknown template 'ghost'"),
    ],
)
def test_other_mistakes_are_one_line_errors(
    env: dict[str, str], tmp_path: Path, args: list[str], expected: str
) -> None:
    import re

    write_spec(tmp_path)
    proc = subprocess.run(
        [*ORBIT, *args], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert re.search(expected, proc.stderr), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_run_survives_the_terminal_that_started_it(env: dict[str, str], tmp_path: Path) -> None:
    """Submit from a shell in its own session, then kill that whole session: the run goes on."""
    spec = write_spec(tmp_path, task={"command": "sleep 2; echo survived"})
    shell = subprocess.Popen(
        ["bash", "-c", f"{' '.join(ORBIT)} submit {spec} --json; sleep 60"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert shell.stdout is not None
    first_line = shell.stdout.readline()
    os.killpg(shell.pid, 9)  # the terminal closes
    shell.wait()
    del first_line
    runs = eventually(lambda: orbit_json(env, "runs", "list"))
    run_id = runs[0]["id"]
    eventually(lambda: orbit_json(env, "status", run_id)["state"] == "succeeded", timeout=20)
    assert orbit(env, "logs", run_id).stdout == "survived\n"


def test_a_dirty_workdir_is_marked_wherever_the_run_is_shown(
    env: dict[str, str], tmp_path: Path
) -> None:
    repo = tmp_path / "code"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(repo)]
    (repo / "train.py").write_text("print('v1')\n")
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "v1"], check=True)
    (repo / "train.py").write_text("print('v2, not committed')\n")
    spec = write_spec(tmp_path, task_type="python", task={"script": "code/train.py"})
    run = orbit_json(env, "submit", str(spec))
    assert run["dirty"] is True
    assert run["provenance"]["workdir"]["dirty"] is True
    assert "DIRTY" in orbit(env, "runs", "show", run["id"]).stdout
    assert "dirty" in orbit(env, "runs", "list").stdout
    assert "DIRTY" in orbit(env, "status", run["id"]).stdout


def test_submit_dry_run_shows_what_would_run_and_writes_nothing(
    env: dict[str, str], tmp_path: Path, orbit_home: Path
) -> None:
    spec = write_spec(
        tmp_path,
        task={"command": ["python3", "-c", "print(1)"], "env": {"MODE": "fast"}},
        overrides={"resources": {"cpu_count": 2}},
    )
    events = orbit_json(env, "audit")  # a server's first start audited its admin already
    plan = orbit(env, "submit", str(spec), "--dry-run").stdout
    assert "nothing was submitted" in plan
    for expected in ("python3 -c print(1)", "MODE", "cpu_count=2", "local_host_process"):
        assert expected in plan, plan
    job = orbit_json(env, "submit", str(spec), "--dry-run")
    assert job["entrypoint"] == ["python3", "-c", "print(1)"] and job["env"] == {"MODE": "fast"}
    assert job["resources"]["cpu_count"] == 2
    # the digest it would have is the one a real submit gets
    bundle_line = next(line for line in plan.splitlines() if line.strip().startswith("bundle"))
    digest = bundle_line.split()[1]
    assert orbit_json(env, "runs", "list") == []
    assert orbit_json(env, "audit") == events
    assert not (orbit_home / "bundles").exists() or not any((orbit_home / "bundles").iterdir())
    run = orbit_json(env, "submit", str(spec))
    assert run["bundle"]["digest"] == digest
    orbit(env, "cancel", run["id"])


def test_runs_list_says_how_many_there_are(env: dict[str, str], tmp_path: Path) -> None:
    spec = write_spec(tmp_path, task={"command": "true"})
    ids = [orbit_json(env, "submit", str(spec))["id"] for _ in range(3)]
    listed = orbit(env, "runs", "list", "--limit", "2")
    assert "2 of 3 runs" in listed.stderr
    assert sum(run_id in listed.stdout for run_id in ids) == 2
    assert "of 3 runs" not in orbit(env, "runs", "list").stderr


def test_logs_follow_says_how_the_run_ended(env: dict[str, str], tmp_path: Path) -> None:
    failing = write_spec(
        tmp_path, task={"command": "echo working; exit 3"}, retry={"max_retries": 0}
    )
    run_id = orbit_json(env, "submit", str(failing))["id"]
    followed = orbit(env, "logs", run_id, "--follow", check=False)
    assert followed.returncode == 1
    assert followed.stdout == "working\n"
    assert f"{run_id} attempt 1 failed: task_exit_nonzero (task), exit 3" in followed.stderr
    ok = orbit_json(env, "submit", str(write_spec(tmp_path, "ok.yaml")))["id"]
    done = orbit(env, "logs", ok, "--follow")
    assert done.stdout == "hello\n" and "succeeded" in done.stderr


def test_logs_follow_goes_through_automatic_retries(env: dict[str, str], tmp_path: Path) -> None:
    # Follow starts at the attempt current when it starts: attempt 1 waits for the follower's
    # first line, or a fast retry would already be on attempt 2 when it looks.
    gate = tmp_path / "followed"
    wait_once = f"case $ORBIT_ATTEMPT_ID in *-1) until [ -e {gate} ]; do sleep 0.05; done;; esac"
    spec = write_spec(
        tmp_path,
        task={"command": f"echo ran $ORBIT_ATTEMPT_ID; {wait_once}; exit 3"},
        retry={"max_retries": 2, "on_exit_codes": [3], "backoff_s": 0},
    )
    run_id = orbit_json(env, "submit", str(spec))["id"]
    follower = subprocess.Popen(
        [*ORBIT, "logs", run_id, "--follow"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert follower.stdout is not None
        first = follower.stdout.readline()
        gate.touch()
        rest, _ = follower.communicate(timeout=60)
    finally:
        follower.kill()
    assert follower.returncode == 1
    assert first + rest == (
        f"ran {run_id}-1\n--- attempt 2 ---\nran {run_id}-2\n--- attempt 3 ---\nran {run_id}-3\n"
    )
    assert orbit(env, "logs", run_id, "--attempt", "2").stdout == f"ran {run_id}-2\n"
    missing = orbit(env, "logs", run_id, "--attempt", "9", check=False)
    assert missing.returncode == 2
    assert missing.stderr == f"orbit: error: run {run_id} has no attempt 9 (it has 3)\n"


def test_the_cli_defines_its_commands_without_importing_what_they_use() -> None:
    """Every command pays for the CLI's definitions before it starts: they import no model,
    validation, store, HTTP or terminal library (each command imports what it needs when it
    runs). A helper imported at the top of a command module can pull them in by accident, as
    a duration's words once pulled pydantic in through orbit.model.auth."""
    heavy = ("pydantic", "orbit.model.models", "orbit.store", "sqlalchemy", "httpx", "rich")
    code = f"import sys, orbit.cli.app; print([m for m in {heavy!r} if m in sys.modules])"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]", found.stdout
