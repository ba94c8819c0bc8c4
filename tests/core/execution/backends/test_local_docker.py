"""The docker launch mode on the local placement, against a real (private) dockerd: runs that
succeed, fail and are cancelled, a missing image, refusals before anything is written, the
orphan sweep, a vanished wrapper, and the generated launch script run by hand."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.dockerd import Dockerd
from tests.helpers import eventually, write_spec

from orbit.core.control.service import CoreControlService
from orbit.core.execution.backends.local_docker import LocalDockerBackend
from orbit.core.execution.bundle import freeze_bundle
from orbit.core.execution.bundle_archive import create_bundle_archive, extract_bundle_archive
from orbit.core.execution.docker.host import docker_facts, local_runner, plane_id
from orbit.core.execution.service import ExecutionService
from orbit.core.tasks import TaskRegistry
from orbit.model.config import Settings
from orbit.model.models import (
    ExecutionOverrides,
    FailureKind,
    FailureReason,
    JobSpec,
    RunState,
    TaskSubmission,
)
from orbit.model.overrides import resolve
from orbit.model.task import StagedPath
from orbit.model.templates import TemplateRegistry, builtin_dir, default_search_path
from orbit.store import Store

ORBIT = [sys.executable, "-m", "orbit"]


# --- helpers ----------------------------------------------------------------------------------


@pytest.fixture
def sqlite_settings(orbit_home: Path) -> Settings:
    """Docker runs do not depend on the store: SQLite only, to keep the suite quick."""
    return Settings(home=orbit_home, database_url=f"sqlite:///{orbit_home / 'orbit.db'}")


@pytest.fixture
def docker_service(sqlite_settings: Settings, docker_host: Dockerd) -> Iterator[CoreControlService]:
    svc = CoreControlService(
        store=Store(sqlite_settings.database_url),
        execution=ExecutionService.default(sqlite_settings),
        templates=TemplateRegistry(default_search_path(sqlite_settings.templates_dir, Path.cwd())),
        tasks=TaskRegistry(),
        bundles_dir=sqlite_settings.bundles_dir,
        actor="tester",
    )
    yield svc
    svc.close()


@pytest.fixture
def env(sqlite_settings: Settings, docker_host: Dockerd) -> dict[str, str]:
    return {
        **os.environ,
        "ORBIT_HOME": str(sqlite_settings.home),
        "ORBIT_DATABASE_URL": sqlite_settings.database_url,
        "DOCKER_HOST": docker_host.host,
        "COLUMNS": "250",
    }


def orbit(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*ORBIT, *args], env=env, capture_output=True, text=True, timeout=90)
    if check and proc.returncode != 0:
        raise AssertionError(f"orbit {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def orbit_json(env: dict[str, str], *args: str) -> Any:
    return json.loads(orbit(env, *args, "--json").stdout)


def docker_spec(folder: Path, command: list[str], **fields: Any) -> Path:
    return write_spec(folder, template="local-docker", task={"command": command}, **fields)


def submit(
    service: CoreControlService, tmp_path: Path, command: list[str], **overrides: Any
) -> Any:
    submission = TaskSubmission(
        experiment_id="exp",
        task_type="command",
        task_request={"command": command},
        template_id="local-docker",
        overrides=ExecutionOverrides.model_validate(overrides),
    )
    return service.submit_task(submission, base_dir=tmp_path)


def attempt_dir(run: Any) -> Path:
    return Path(run.current.handle.location)


def text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


# --- runs through the CLI ---------------------------------------------------------------------


def test_a_run_in_a_container_succeeds_and_leaves_no_container(
    env: dict[str, str], docker_host: Dockerd, tmp_path: Path
) -> None:
    spec = docker_spec(
        tmp_path,
        [
            "sh",
            "-c",
            'echo "in the container as $ORBIT_ATTEMPT_ID in $PWD"; echo "$GREETING" >&2; '
            'echo saved > "$ORBIT_ARTIFACTS_DIR/out.txt"',
        ],
        overrides={"runtime_env": {"GREETING": "hello from the env"}},
    )
    run = orbit_json(env, "submit", str(spec), "--set", f"image={docker_host.image}", "--wait")
    attempt = run["attempts"][0]
    assert run["state"] == "succeeded", attempt
    assert run["request"]["launch_mode"]["image"] == docker_host.image
    location = Path(attempt["handle"]["location"])
    training = (location / "artifacts" / "training.log").read_text()
    assert f"in the container as {attempt['id']} in /orbit/bundle/inputs/workdir" in training
    assert "hello from the env" in training
    assert (location / "artifacts" / "out.txt").read_text() == "saved\n"  # through the mount
    image = json.loads((location / "runtime" / "image.json").read_text())
    assert image["ref"] == docker_host.image
    assert image["id"] == docker_host.image_id(docker_host.image)
    # the wrapper stayed on the host: its own files are there as for a host process
    assert json.loads((location / "runtime" / "result.json").read_text())["exit_code"] == 0
    assert (location / "artifacts" / "manifest.json").is_file()
    # busybox has no python, and nothing critical was declared: the precheck says so, no more
    assert "precheck skipped" in (location / "artifacts" / "runtime-precheck.log").read_text()
    assert docker_host.containers(f"label=orbit.attempt={attempt['id']}") == []
    shown = orbit(env, "runs", "show", run["id"]).stdout
    assert docker_host.image in shown and image["id"][:19] in shown
    shown_json = orbit_json(env, "runs", "show", run["id"])
    assert shown_json["attempts"][0]["image"]["id"] == image["id"]


def test_a_secret_is_the_containers_env_alone_never_a_label_or_a_command_line(
    env: dict[str, str], docker_host: Dockerd, tmp_path: Path
) -> None:
    value = "hf_ContainerSecret_q1w2e3r4t5y6"
    subprocess.run(
        [*ORBIT, "secrets", "set", "hf"], env=env, input=value, text=True, check=True,
        capture_output=True,
    )  # fmt: skip
    spec = docker_spec(
        tmp_path, ["sh", "-c", 'echo "token=$HF_TOKEN"; echo started; sleep 30'],
        secrets={"HF_TOKEN": "hf"},
    )  # fmt: skip
    run = orbit_json(env, "submit", str(spec), "--set", f"image={docker_host.image}")
    attempt_id = run["attempts"][0]["id"]
    location = Path(run["attempts"][0]["handle"]["location"])
    eventually(lambda: "started" in text(location / "artifacts" / "training.log"), 30)
    name = f"orbit-{attempt_id}-n0"
    inspected = json.loads(docker_host.docker("inspect", name).stdout)[0]
    assert f"HF_TOKEN={value}" in inspected["Config"]["Env"]  # the container's environment
    for part in ("Labels", "Cmd", "Entrypoint"):
        assert value not in json.dumps(inspected["Config"][part]), part
    assert value not in json.dumps(inspected["Args"]) + inspected["Path"]
    listed = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
    assert value not in listed.stdout  # nor any command line on the host
    scripts = location / "scripts"
    assert "-e HF_TOKEN" in (scripts / "docker_run.sh").read_text()
    assert not any(value in p.read_text(errors="replace") for p in scripts.iterdir())
    orbit_json(env, "cancel", run["id"])
    assert "token=***" in (location / "artifacts" / "training.log").read_text()


def test_a_container_cannot_rewrite_what_the_wrapper_runs_on_the_host(
    env: dict[str, str], docker_host: Dockerd, tmp_path: Path
) -> None:
    """The container's root writes inputs/ and artifacts/; the bundle itself (job.json, scripts/:
    what the wrapper runs on the host, as its own user) and runtime/ (the wrapper's status and
    result) are read-only in it, and a link it leaves where the wrapper writes is not followed
    out of the attempt."""
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched\n")
    spec = docker_spec(
        tmp_path,
        [
            "sh",
            "-c",
            "echo 'echo PWNED' > /orbit/bundle/scripts/docker_stop.sh && echo WROTE-SCRIPTS; "
            "echo x > /orbit/bundle/job.json && echo WROTE-JOB; "
            "rm -rf /orbit/bundle/runtime && echo REPLACED-RUNTIME; "
            "rm -f /orbit/bundle/runtime/status.json && echo REMOVED-STATUS; "
            f"ln -s {outside} /orbit/bundle/artifacts/manifest.json; "
            "echo ok > $ORBIT_ARTIFACTS_DIR/out.txt; echo done",
        ],
    )
    run = orbit_json(env, "submit", str(spec), "--set", f"image={docker_host.image}", "--wait")
    attempt = run["attempts"][0]
    location = Path(attempt["handle"]["location"])
    training = (location / "artifacts" / "training.log").read_text()
    assert "done" in training and "Read-only file system" in training, training
    for leak in ("WROTE-SCRIPTS", "WROTE-JOB", "REPLACED-RUNTIME", "REMOVED-STATUS"):
        assert leak not in training, training
    # the wrapper's own files stayed whole: the one attempt ended as the task did, not lost
    assert run["state"] == "succeeded" and len(run["attempts"]) == 1, attempt
    assert "PWNED" not in (location / "scripts" / "docker_stop.sh").read_text()
    assert outside.read_text() == "untouched\n"  # the manifest was not written through it
    assert (location / "artifacts" / "out.txt").read_text() == "ok\n"


def test_a_failing_task_keeps_its_exit_code_and_leaves_no_container(
    env: dict[str, str], docker_host: Dockerd, tmp_path: Path
) -> None:
    spec = docker_spec(tmp_path, ["sh", "-c", "echo about to fail; exit 3"])
    proc = orbit(
        env, "submit", str(spec), "--set", f"image={docker_host.image}", "--wait", "--json",
        check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    run = json.loads(proc.stdout)
    attempt = run["attempts"][0]
    assert run["state"] == "failed"
    assert attempt["reason"] == "task_exit_nonzero" and attempt["exit_code"] == 3
    assert len(run["attempts"]) == 1  # the task's own failure: not retried
    assert docker_host.containers(f"label=orbit.attempt={attempt['id']}") == []
    log = orbit(env, "logs", run["id"]).stdout
    assert "about to fail" in log


def test_a_string_command_runs_with_sh_in_an_image_without_bash(
    env: dict[str, str], docker_host: Dockerd, tmp_path: Path
) -> None:
    """busybox has /bin/sh and no bash: a string command runs there as Docker's shell form."""
    assert docker_host.docker(
        "run", "--rm", docker_host.image, "ls", "/bin/bash", check=False
    ).returncode
    spec = write_spec(
        tmp_path,
        template="local-docker",
        task={"command": 'for word in shell form; do echo "$word"; done; echo "ran by $0"'},
    )
    run = orbit_json(env, "submit", str(spec), "--set", f"image={docker_host.image}", "--wait")
    assert run["state"] == "succeeded", run["attempts"][0]
    assert orbit(env, "logs", run["id"]).stdout == "shell\nform\nran by /bin/sh\n"


def test_cancel_stops_the_container_gracefully_then_removes_it(
    env: dict[str, str], docker_host: Dockerd, tmp_path: Path
) -> None:
    script = (
        'trap "echo stopping gracefully; exit 0" TERM; echo started; while true; do sleep 0.1; done'
    )
    spec = docker_spec(tmp_path, ["sh", "-c", script])
    run = orbit_json(
        env, "submit", str(spec), "--set", f"image={docker_host.image}", "--set", "stop_grace_s=20"
    )
    attempt_id = run["attempts"][0]["id"]
    location = Path(run["attempts"][0]["handle"]["location"])
    eventually(lambda: "started" in text(location / "artifacts" / "training.log"), 30)
    assert docker_host.containers(f"label=orbit.attempt={attempt_id}", "status=running") == [
        f"orbit-{attempt_id}-n0"
    ]
    cancelled = orbit_json(env, "cancel", run["id"])
    attempt = cancelled["attempts"][0]
    assert cancelled["state"] == "terminated" and attempt["reason"] == "cancelled"
    # docker stop's SIGTERM reached the task, which stopped on its own well within the grace
    assert "stopping gracefully" in (location / "artifacts" / "training.log").read_text()
    assert "stopping container" in (location / "runtime" / "runtime.log").read_text()
    assert docker_host.containers(f"label=orbit.attempt={attempt_id}") == []


def test_the_container_is_limited_to_the_jobs_cpus_and_memory(
    env: dict[str, str], docker_host: Dockerd, tmp_path: Path
) -> None:
    """Read from the running container's HostConfig: what docker enforces, not what was asked."""
    spec = docker_spec(tmp_path, ["sh", "-c", "echo started; sleep 60"])

    def limits_while_it_runs(*sets: str) -> tuple[int, int]:
        run = orbit_json(env, "submit", str(spec), "--set", f"image={docker_host.image}", *sets)
        attempt_id = run["attempts"][0]["id"]
        location = Path(run["attempts"][0]["handle"]["location"])
        eventually(lambda: "started" in text(location / "artifacts" / "training.log"), 30)
        name = f"orbit-{attempt_id}-n0"
        shown = docker_host.docker(
            "inspect", "--format", "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}}", name
        ).stdout.split()
        orbit(env, "cancel", run["id"])
        return int(shown[0]), int(shown[1])

    # the template's defaults ask for nothing: on your own machine, no limit
    assert limits_while_it_runs() == (0, 0)
    one = ("--set", "resources.cpu_count=1", "--set", "resources.memory_gb=0.5")
    assert limits_while_it_runs(*one) == (1_000_000_000, 512 * 1024 * 1024)
    # more CPUs than the Docker host has: all it has (docker would refuse more)
    ncpu = int(docker_host.docker("info", "--format", "{{.NCPU}}").stdout)
    many = ("--set", f"resources.cpu_count={ncpu + 8}", "--set", "resources.memory_gb=2")
    assert limits_while_it_runs(*many) == (ncpu * 1_000_000_000, 2 * 1024**3)
    # 0 asks for nothing: no limit
    none = ("--set", "resources.cpu_count=0", "--set", "resources.memory_gb=0")
    assert limits_while_it_runs(*none) == (0, 0)


def test_refusals_come_before_anything_is_written(
    env: dict[str, str], docker_host: Dockerd, tmp_path: Path, sqlite_settings: Settings
) -> None:
    spec = docker_spec(tmp_path, ["true"])
    no_image = orbit(env, "submit", str(spec), check=False)
    assert no_image.returncode == 2
    assert no_image.stderr.strip().count("\n") == 0
    assert "launch_mode.image: template 'local-docker' names no image" in no_image.stderr
    gpus = orbit(
        env, "submit", str(spec), "--set", f"image={docker_host.image}",
        "--set", "resources.gpu_count=1", check=False,
    )  # fmt: skip
    assert gpus.returncode == 2 and gpus.stderr.strip().count("\n") == 0
    assert "resources.gpu_count=1" in gpus.stderr
    assert "no NVIDIA container runtime" in gpus.stderr
    no_daemon = orbit(
        {**env, "DOCKER_HOST": f"unix://{tmp_path}/nothing.sock"},
        "submit", str(spec), "--set", f"image={docker_host.image}", check=False,
    )  # fmt: skip
    assert no_daemon.returncode == 2
    assert f"docker is not reachable at DOCKER_HOST=unix://{tmp_path}/nothing.sock" in (
        no_daemon.stderr
    )
    assert orbit_json(env, "runs", "list") == []
    bundles = sqlite_settings.bundles_dir
    assert not bundles.exists() or not any(p for p in bundles.iterdir() if p.name[0] != ".")


# --- runs through the service -----------------------------------------------------------------


def test_a_missing_image_is_image_not_found_and_not_retried(
    docker_service: CoreControlService, tmp_path: Path
) -> None:
    # a registry on the loopback that does not answer: the pull fails at once, nothing leaves
    missing = "127.0.0.1:9/orbit-test/missing:1"
    run = submit(docker_service, tmp_path, ["true"], image=missing)
    done = docker_service.wait_for(run.id, timeout_s=60, poll_s=0.1)
    assert done.state is RunState.FAILED
    assert done.current.reason is FailureReason.IMAGE_NOT_FOUND
    assert FailureReason.IMAGE_NOT_FOUND.kind is FailureKind.ENVIRONMENT
    assert missing in (done.current.message or "") and "could not be pulled" in (
        done.current.message or ""
    )
    assert len(done.attempts) == 1  # not the infrastructure's fault: no automatic retry
    assert not (attempt_dir(done) / "artifacts" / "training.log").exists()  # nothing ran


def test_precheck_runs_inside_the_image(
    docker_service: CoreControlService, tmp_path: Path, docker_host: Dockerd
) -> None:
    """The image's own interpreter is the one checked: busybox has none, so a declared
    critical import cannot be there."""
    submission = TaskSubmission(
        experiment_id="exp",
        task_type="command",
        task_request={"command": ["echo", "never runs"], "critical_imports": ["torch"]},
        template_id="local-docker",
        overrides=ExecutionOverrides(image=docker_host.image),
    )
    run = docker_service.submit_task(submission, base_dir=tmp_path)
    done = docker_service.wait_for(run.id, timeout_s=60, poll_s=0.1)
    assert done.current.reason is FailureReason.DEPENDENCY_MISSING
    assert "the image has no interpreter" in (done.current.message or "")
    assert docker_host.containers(f"label=orbit.attempt={done.current.id}") == []


def test_a_vanished_wrapper_takes_its_container_with_it(
    docker_service: CoreControlService, tmp_path: Path, docker_host: Dockerd
) -> None:
    run = submit(
        docker_service, tmp_path, ["sh", "-c", "echo up; sleep 300"], image=docker_host.image
    )
    location = attempt_dir(run)
    eventually(lambda: "up" in text(location / "artifacts" / "training.log"), 30)
    os.kill(int((location / "runtime" / "pid").read_text()), signal.SIGKILL)
    first = eventually(
        lambda: next(
            (a for a in docker_service.refresh_run_status(run.id).attempts if a.state.terminal),
            None,
        ),
        timeout=30,
    )
    assert first.reason is FailureReason.RUNTIME_LOST
    assert docker_host.containers(f"label=orbit.attempt={first.id}") == []
    docker_service.cancel_run(run.id)  # the automatic retry runs the same task again: stop it
    for attempt in docker_service.get_run(run.id).attempts:
        assert docker_host.containers(f"label=orbit.attempt={attempt.id}") == []


# --- the sweep ----------------------------------------------------------------------------------


def test_the_sweep_removes_orphans_and_never_touches_other_containers(
    sqlite_settings: Settings, docker_host: Dockerd
) -> None:
    backend = LocalDockerBackend(sqlite_settings.work_dir)
    plane = plane_id(sqlite_settings.work_dir)
    ours = ["--label", "orbit.managed=1", "--label", f"orbit.plane={plane}"]

    def start(name: str, *labels: str) -> None:
        argv = ["run", "-d", "--init", "--name", name, *labels, docker_host.image, "sleep", "300"]
        docker_host.docker(*argv)

    start("orphan", *ours, "--label", "orbit.attempt=run-gone-1", "--label", "orbit.node=0")
    start("live", *ours, "--label", "orbit.attempt=run-live-1", "--label", "orbit.node=0")
    start("stranger")  # no ORBIT label at all
    start(
        "elsewhere",  # ORBIT's, but another control plane's
        "--label", "orbit.managed=1", "--label", "orbit.plane=another",
        "--label", "orbit.attempt=run-other-1",
    )  # fmt: skip
    gone = ["--label", "orbit.attempt=run-gone-2"]
    docker_host.docker("create", "--name", "exited-orphan", *ours, *gone, docker_host.image, "true")
    try:
        result = backend.sweep({"run-live-1"})
        assert sorted(c.name for c in result.removed) == ["exited-orphan", "orphan"]
        assert [c.name for c in result.kept] == ["live"]
        assert not result.errors
        left = docker_host.containers()
        assert "orphan" not in left and "exited-orphan" not in left
        assert {"live", "stranger", "elsewhere"} <= set(left)
        assert not backend.sweep({"run-live-1"}).removed  # nothing more to do
    finally:
        docker_host.docker("rm", "-f", "orphan", "live", "stranger", "elsewhere", check=False)


# --- the bundle's scripts, by hand ------------------------------------------------------------


def docker_job(image: str, command: tuple[str, ...], **fields: Any) -> JobSpec:
    template = TemplateRegistry([builtin_dir()]).get("local-docker")
    request = resolve(template, ExecutionOverrides(image=image))
    return JobSpec(
        task_type="command",
        template_id="local-docker",
        launch_mode=request.launch_mode,
        entrypoint=command,
        **fields,
    )


def test_the_generated_launch_script_runs_by_hand(tmp_path: Path, docker_host: Dockerd) -> None:
    job = docker_job(
        docker_host.image,
        ("sh", "-c", 'echo "by hand: $ORBIT_RUN_ID/$ORBIT_ATTEMPT_ID $GREETING"; ls /orbit/bundle'),
        env={"GREETING": "it's quoted"},
    )
    src = tmp_path / "project"
    src.mkdir()
    frozen = freeze_bundle(job, [StagedPath(src, "workdir")], tmp_path / "cache")
    archive = create_bundle_archive(frozen.path, tmp_path / "bundle.tar")
    bundle = extract_bundle_archive(archive, tmp_path / "a box" / "bundle")  # a space: quoting
    env = {**os.environ, "ORBIT_RUN_ID": "r1", "ORBIT_ATTEMPT_ID": "r1-by-hand"}
    proc = subprocess.run(
        ["sh", str(bundle / "scripts" / "docker_run.sh")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "by hand: r1/r1-by-hand it's quoted" in proc.stdout
    assert {"job.json", "inputs", "scripts"} <= set(proc.stdout.split())
    assert docker_host.containers("label=orbit.attempt=r1-by-hand") == []  # --rm by hand
    failing = subprocess.run(
        ["sh", str(bundle / "scripts" / "docker_run.sh"), "sh", "-c", "exit 7"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert failing.returncode == 7  # any command, in the same setup, with its exit code


def test_docker_facts_of_a_real_daemon_and_of_none(
    docker_host: Dockerd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts = docker_facts(local_runner)
    assert facts.available and facts.server_version
    assert "runc" in facts.runtimes and not facts.nvidia  # this host: no NVIDIA runtime
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    gone = docker_facts(local_runner)
    assert not gone.available and "Cannot connect" in (gone.error or "")


def test_the_precheck_checks_the_images_own_interpreter(
    docker_service: CoreControlService, tmp_path: Path, python_image: str, docker_host: Dockerd
) -> None:
    """In an image with python, the precheck imports the critical names there: the image's
    interpreter and the staged workdir, as the task will see them."""
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "helper.py").write_text("X = 42\n")
    (tmp_path / "proj" / "train.py").write_text("import helper\nprint('ran with', helper.X)\n")
    submission = TaskSubmission(
        experiment_id="exp",
        task_type="python",
        task_request={"script": "proj/train.py", "critical_imports": ["json", "helper"]},
        template_id="local-docker",
        overrides=ExecutionOverrides(image=python_image),
    )
    run = docker_service.submit_task(submission, base_dir=tmp_path)
    done = docker_service.wait_for(run.id, timeout_s=60, poll_s=0.1)
    location = attempt_dir(done)
    assert done.state is RunState.SUCCEEDED, text(location / "runtime" / "runtime.log")
    report = json.loads((location / "runtime" / "precheck.json").read_text())
    found = {i["name"]: i["path"] for i in report["critical_imports"]}
    assert found["helper"] == "/orbit/bundle/inputs/workdir/helper.py"  # as the task sees it
    assert found["json"].startswith("/usr/lib/python3")  # the image's python, not the venv's
    assert "ran with 42" in text(location / "artifacts" / "training.log")
