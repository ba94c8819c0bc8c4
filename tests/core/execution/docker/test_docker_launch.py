"""The docker launch mode without a Docker daemon: templates, validation, the generated scripts,
and how the image that ran shows in `orbit diff`, `orbit inspect` and `orbit runs show`."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from orbit.cli import render
from orbit.cli.text import Printer
from orbit.core.control.views import RunView
from orbit.core.execution.bundle import freeze_bundle
from orbit.core.execution.docker.host import DockerFacts
from orbit.core.execution.docker.scripts import run_script, stop_script
from orbit.core.tasks import TaskRegistry
from orbit.forensics.diagnose import Verdict, inspect_run
from orbit.forensics.evidence import Evidence
from orbit.forensics.rundiff import diff_runs
from orbit.model.errors import InvalidInput
from orbit.model.launch_modes import task_entrypoint
from orbit.model.models import (
    ExecutionOverrides,
    FailureKind,
    FailureReason,
    JobSpec,
    LaunchMode,
    Resources,
    RunHandle,
    RunState,
)
from orbit.model.overrides import resolve
from orbit.model.records import AttemptRecord, RunRecord
from orbit.model.task import StagedPath
from orbit.model.templates import TemplateRegistry, builtin_dir, load_template_file
from tests.helpers import a_request, a_submission

TEMPLATE = """\
id: box
placement: {kind: local}
launch_mode:
  kind: docker
  image: repo/train:1
  network: none
  user: host
  mounts: ["/data/sets:/datasets:ro", "/scratch:/scratch"]
  env_passthrough: [HF_TOKEN]
allow_overrides: [image, resources]
"""


def template(tmp_path: Path, text: str = TEMPLATE, name: str = "box") -> Any:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return load_template_file(path)


def job_for(request: Any, **fields: Any) -> JobSpec:
    return JobSpec(
        task_type="command",
        template_id=request.template_id,
        launch_mode=request.launch_mode,
        entrypoint=("python3", "train.py", "--lr", "1e-4"),
        resources=request.resources,
        **fields,
    )


# --- templates and validation -----------------------------------------------------------------


def test_the_builtin_docker_templates_allow_what_the_issue_asks() -> None:
    registry = TemplateRegistry([builtin_dir()])
    for template_id, placement in (("local-docker", "local"), ("ssh-docker", "ssh")):
        found = registry.get(template_id)
        assert found.placement.kind == placement and found.launch_mode.kind == "docker"
        assert {"image", "target", "resources", "runtime_env"} <= set(found.allow_overrides)
        request = resolve(found, ExecutionOverrides(image="python:3.11-slim"))
        assert request.backend_key == f"{placement}_docker"
        assert request.launch_mode.model_dump()["image"] == "python:3.11-slim"


def test_a_docker_run_needs_an_image_and_says_how_to_give_one() -> None:
    local_docker = TemplateRegistry([builtin_dir()]).get("local-docker")
    with pytest.raises(InvalidInput) as info:
        resolve(local_docker, ExecutionOverrides())
    assert str(info.value) == (
        "launch_mode.image: template 'local-docker' names no image; give one with "
        "--set image=REF (or `overrides: {image: REF}` in the spec)"
    )


def test_the_image_override_is_whitelisted_and_lands_in_the_launch_mode(tmp_path: Path) -> None:
    box = template(tmp_path)
    assert resolve(box, ExecutionOverrides()).launch_mode.model_dump()["image"] == "repo/train:1"
    request = resolve(box, ExecutionOverrides(image="repo/train@sha256:" + "a" * 64))
    settings = request.launch_mode.model_dump()
    assert settings["image"] == "repo/train@sha256:" + "a" * 64
    assert settings["shm_size"] == "8g" and settings["pull"] == "missing"  # defaults filled in
    local = TemplateRegistry([builtin_dir()]).get("local")
    with pytest.raises(Exception, match=r"override 'image' is not allowed by template 'local'"):
        resolve(local, ExecutionOverrides(image="x:1"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("network: none", "netwerk: none"), r"box.yaml: launch_mode.netwerk: unknown key"),
        (("user: host", "user: me"), r"box.yaml: launch_mode.user: Input should be 'image'"),
        (
            ('"/scratch:/scratch"', '"scratch:/scratch"'),
            r"launch_mode.mounts: 'scratch:/scratch': both paths must be absolute",
        ),
        (
            ('"/scratch:/scratch"', '"/s:/orbit/x"'),
            r"'/s:/orbit/x': /orbit is where ORBIT mounts the bundle",
        ),
        (("kind: docker", "kind: podman"), r"launch_mode.kind: 'podman' is not a launch mode"),
        (("env_passthrough: [HF_TOKEN]", "env_passthrough: [HF-TOKEN]"), r"'HF-TOKEN' is not"),
    ],
)
def test_a_wrong_docker_setting_is_refused_naming_the_file_and_field(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        template(tmp_path, TEMPLATE.replace(*change))


def test_gpus_need_an_nvidia_runtime() -> None:
    plain = DockerFacts(available=True, runtimes=("io.containerd.runc.v2", "runc"))
    assert plain.gpu_refusal() == (
        "the Docker host has no NVIDIA container runtime (its runtimes: io.containerd.runc.v2, "
        "runc)"
    )
    assert (
        DockerFacts(available=True, runtimes=("nvidia", "runc"), nvidia=True).gpu_refusal() is None
    )
    assert FailureReason.IMAGE_NOT_FOUND.kind is FailureKind.ENVIRONMENT  # never auto-retried


# --- the generated scripts ----------------------------------------------------------------------


def test_the_scripts_are_readable_deterministic_and_part_of_the_digest(tmp_path: Path) -> None:
    request = resolve(template(tmp_path), ExecutionOverrides())
    job = job_for(request, env={"GREETING": "it's here"}, stop_grace_s=7.5)
    script = run_script(job)
    for expected in (
        '--name "$name"',
        "--label orbit.managed=1",
        '--label "orbit.run=$run_id"',
        '--label "orbit.attempt=$attempt_id"',
        '--label "orbit.node=$node"',
        "--network none",
        "--shm-size 8g",
        # the bundle read-only (the wrapper runs its scripts on the host), what the task
        # writes in folders of its own; runtime/ (the wrapper's) writable for the precheck only
        '--mount "type=bind,\\"source=$bundle\\",target=/orbit/bundle,readonly"',
        '--mount "type=bind,\\"source=$bundle/inputs\\",target=/orbit/bundle/inputs"',
        '--mount "type=bind,\\"source=$bundle/runtime\\",'
        'target=/orbit/bundle/runtime$runtime_mount"',
        "runtime_mount=,readonly  # runtime/ is the wrapper's: the task reads it, never writes",
        "  runtime_mount=  # the precheck writes runtime/precheck.json",
        '--mount "type=bind,\\"source=$bundle/artifacts\\",target=/orbit/bundle/artifacts"',
        "--workdir /orbit/bundle/inputs/workdir",
        "-e 'GREETING=it'\"'\"'s here'",
        "-e HF_TOKEN",
        "--mount type=bind,source=/data/sets,target=/datasets,readonly",
        "--mount type=bind,source=/scratch,target=/scratch \\",
        '--user "$(id -u):$(id -g)"',
        "image=${ORBIT_IMAGE:-repo/train:1}",
        'set -- "$image" python3 train.py --lr 1e-4',
    ):
        assert expected in script, expected
    assert "--gpus" not in script  # the job asks for none
    assert "stop --time 8" in stop_script(job)  # whole seconds, rounded up
    gpu_job = job_for(request.model_copy(update={"resources": Resources(gpu_count=2)}))
    assert '--gpus "\\"device=$ORBIT_GPUS\\""' in run_script(gpu_job)
    assert "--gpus 2" in run_script(gpu_job)

    src = tmp_path / "src"
    src.mkdir()
    first = freeze_bundle(job, [StagedPath(src, "workdir")], tmp_path / "cache")
    again = freeze_bundle(job, [StagedPath(src, "workdir")], tmp_path / "cache2")
    assert first.digest == again.digest
    scripts = first.path / "scripts"
    assert {"docker_run.sh", "docker_stop.sh", "orbit_docker.py"} <= {
        p.name for p in scripts.iterdir()
    }
    other_image = resolve(template(tmp_path), ExecutionOverrides(image="repo/train:2"))
    moved = freeze_bundle(job_for(other_image, env=job.env, stop_grace_s=7.5), [], tmp_path / "c3")
    assert moved.digest != first.digest  # the image is part of what ran


def test_the_jobs_cpus_and_memory_are_the_containers_limits(tmp_path: Path) -> None:
    request = resolve(template(tmp_path), ExecutionOverrides())
    script = run_script(job_for(request))  # the defaults: 1 CPU, 1 GB
    assert "cpus=1\n" in script and 'set -- --cpus "$cpus" "$@"' in script
    assert 'set -- --memory 1024m "$@"' in script
    sized = Resources(cpu_count=8, memory_gb=0.5)
    script = run_script(job_for(request.model_copy(update={"resources": sized})))
    assert "cpus=8\n" in script and "--memory 512m" in script
    # docker takes no more CPUs than its host has: the script asks it how many that is
    assert 'ncpu=$("${DOCKER:-docker}" info --format "{{.NCPU}}" 2>/dev/null)' in script
    unlimited = Resources(cpu_count=0, memory_gb=0)
    script = run_script(job_for(request.model_copy(update={"resources": unlimited})))
    assert "--cpus" not in script and "--memory" not in script
    tiny = Resources(cpu_count=0, memory_gb=0.001)
    assert "--memory 6m" in run_script(job_for(request.model_copy(update={"resources": tiny})))


def test_a_string_command_runs_with_sh_in_a_container_and_bash_on_a_host(tmp_path: Path) -> None:
    """Docker's own shell form: images without bash (alpine, busybox) still run a string
    command. The shell follows from the launch mode alone, so the digest stays the same."""
    shaped = TaskRegistry().shape("command", {"command": "echo $0; exit 3"}, tmp_path, "spec")
    registry = TemplateRegistry([builtin_dir()])
    docker = resolve(registry.get("local-docker"), ExecutionOverrides(image="alpine:3"))
    host = resolve(registry.get("local"), ExecutionOverrides())
    assert task_entrypoint(docker.launch_mode, shaped) == ("/bin/sh", "-c", "echo $0; exit 3")
    assert task_entrypoint(host.launch_mode, shaped) == ("bash", "-c", "echo $0; exit 3")
    argv = TaskRegistry().shape("command", {"command": ["bash", "-c", "x"]}, tmp_path, "spec")
    assert task_entrypoint(docker.launch_mode, argv) == ("bash", "-c", "x")  # as given

    def job() -> JobSpec:
        return JobSpec(
            task_type="command",
            template_id=docker.template_id,
            launch_mode=docker.launch_mode,
            entrypoint=task_entrypoint(docker.launch_mode, shaped),
        )

    assert "set -- \"$image\" /bin/sh -c 'echo $0; exit 3'" in run_script(job())
    first = freeze_bundle(job(), [], tmp_path / "cache")
    again = freeze_bundle(job(), [], tmp_path / "cache2")
    assert first.digest == again.digest


def test_a_host_process_bundle_gets_no_docker_scripts(tmp_path: Path) -> None:
    request = resolve(TemplateRegistry([builtin_dir()]).get("local"), ExecutionOverrides())
    frozen = freeze_bundle(job_for(request), [], tmp_path / "cache")
    assert not (frozen.path / "scripts" / "docker_run.sh").exists()


# --- what ran: diff, inspect, runs show -------------------------------------------------------

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def evidence(run_id: str, image: dict[str, Any] | None, reason: FailureReason | None) -> Evidence:
    state = RunState.FAILED if reason else RunState.SUCCEEDED
    attempt = AttemptRecord(
        id=f"{run_id}-1",
        run_id=run_id,
        number=1,
        state=state,
        reason=reason,
        target="localhost",
        backend_key="local_docker",
        trigger="submit",
        handle=RunHandle(
            backend_key="local_docker", target="localhost", attempt_id=f"{run_id}-1", location="/x"
        ),
        exit_code=None if reason else 0,
        message=f"image {image and image['ref']} is not on the Docker host" if reason else None,
        cancel_requested=False,
        created_at=NOW,
        updated_at=NOW,
        started_at=NOW,
        finished_at=NOW,
    )
    ref = image["ref"] if image else "repo/train:9"
    run = RunRecord(
        id=run_id,
        experiment_id="exp-1",
        experiment_name="exp",
        task_type="command",
        template_id="local-docker",
        bundle_digest=run_id * 8,
        submission=a_submission(template_id="local-docker", overrides={"image": ref}),
        request=a_request("local_docker", "localhost", template_id="local-docker").model_copy(
            update={"launch_mode": LaunchMode(kind="docker", image=ref)}
        ),
        created_at=NOW,
        created_by="tester",
        attempts=(attempt,),
    )
    job = {"entrypoint": ["true"], "launch_mode": {"kind": "docker", "image": ref}}
    files = {"job.json": json.dumps(job).encode()}
    if image is not None:
        files["runtime/image.json"] = json.dumps(image).encode()
        files["runtime/runtime.log"] = b"x wrapper started on box\n"
    return Evidence(run=run, attempt=attempt, files=files)


def image(ref: str, digit: str) -> dict[str, Any]:
    return {
        "ref": ref,
        "id": "sha256:" + digit * 64,
        "repo_digests": [f"repo/train@sha256:{digit}"],
    }


def test_diff_shows_two_runs_that_ran_different_images() -> None:
    a = evidence("run-a", image("repo/train:1", "1"), None)
    b = evidence("run-b", image("repo/train:2", "2"), None)
    found = {d.key: (d.a, d.b) for d in diff_runs(a, b)}
    assert found["image.id"] == ("sha256:" + "1" * 64, "sha256:" + "2" * 64)
    assert found["image.digests"] == ("repo/train@sha256:1", "repo/train@sha256:2")
    assert found["launch_mode.image"] == ("repo/train:1", "repo/train:2")
    assert found["overrides.image"] == ("repo/train:1", "repo/train:2")
    # the same tag that resolved to another image on another day: only the id tells
    moved = evidence("run-c", image("repo/train:1", "3"), None)
    keys = {d.key for d in diff_runs(a, moved)}
    assert "image.id" in keys and "launch_mode.image" not in keys


def test_inspect_puts_a_missing_image_in_the_runtime_layer() -> None:
    found = inspect_run(evidence("run-d", None, FailureReason.IMAGE_NOT_FOUND))
    assert found.first_wrong is not None and found.first_wrong.layer == "runtime"
    assert found.first_wrong.verdict is Verdict.FAILED
    assert "image_not_found" in found.first_wrong.summary
    ran = inspect_run(evidence("run-f", image("repo/train:1", "5"), None))
    assert "image repo/train:1 @ sha256:555555555555" in ran.layers[0].summary


def test_runs_show_names_the_image_that_ran(capsys: pytest.CaptureFixture[str]) -> None:
    ev = evidence("run-e", image("repo/train:1", "4"), None)
    images = {ev.attempt.id: image("repo/train:1", "4")}
    view = RunView(run=ev.run, bundle_path="/cache/d", images=images)
    render.show_run(Printer("stdout"), view)
    assert "image      repo/train:1 @ sha256:444444444444 (repo/train@sha256:4)" in (
        capsys.readouterr().out
    )
    data = render.run_json(view)
    assert data["attempts"][0]["image"]["id"] == "sha256:" + "4" * 64
