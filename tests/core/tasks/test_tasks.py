"""Task plugins through the registry: validation, shaping, staging, and a third party's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field

from orbit.core.tasks import ShapedTask, StagedPath, TaskPlugin, TaskRegistry
from orbit.core.tasks.command import CommandTask
from orbit.core.tasks.python import PythonTask
from orbit.model.errors import InvalidInput, NotFound

SOURCE = "SPEC.yaml"


def shape(task_type: str, raw: dict[str, Any], base_dir: Path) -> ShapedTask:
    return TaskRegistry().shape(task_type, raw, base_dir, SOURCE)


def refusal(task_type: str, raw: dict[str, Any], base_dir: Path) -> str:
    with pytest.raises(InvalidInput) as info:
        shape(task_type, raw, base_dir)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- the registry -----------------------------------------------------------------------------


def test_builtin_task_types_are_found_by_name() -> None:
    reg = TaskRegistry()
    assert {"command", "python"} <= set(reg.names())
    assert reg.names() == sorted(reg.names())
    assert isinstance(reg.plugin("command"), CommandTask)
    assert isinstance(reg.plugin("python"), PythonTask)


def test_unknown_task_type_is_not_found_listing_the_known(tmp_path: Path) -> None:
    reg = TaskRegistry()
    with pytest.raises(NotFound) as info:
        reg.shape("torchrnu", {"command": "x"}, tmp_path, SOURCE)
    message = str(info.value)
    assert "'torchrnu'" in message
    for name in reg.names():
        assert name in message


# --- command ----------------------------------------------------------------------------------


def test_command_string_runs_through_bash(tmp_path: Path) -> None:
    shaped = shape("command", {"command": "echo $X && exit 3", "env": {"X": "1"}}, tmp_path)
    assert shaped.entrypoint == ("bash", "-c", "echo $X && exit 3")
    assert shaped.env == {"X": "1"}
    assert shaped.staged == ()
    assert shaped.workdir == "workdir"
    assert shaped.request == {"command": "echo $X && exit 3", "env": {"X": "1"}, "workdir": None}


@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=6))
def test_command_list_is_the_argv_as_given(argv: list[str]) -> None:
    shaped = shape("command", {"command": argv}, Path("/nonexistent-base"))
    assert shaped.entrypoint == tuple(argv)
    assert shaped.request["command"] == argv


def test_command_workdir_is_staged(tmp_path: Path) -> None:
    (tmp_path / "project" / "src").mkdir(parents=True)
    shaped = shape("command", {"command": ["make"], "workdir": "project/src"}, tmp_path)
    assert shaped.staged == (StagedPath(source=tmp_path / "project" / "src", dest="workdir"),)
    absolute = shape(
        "command", {"command": "make", "workdir": str(tmp_path / "project")}, Path("/")
    )
    assert absolute.staged[0].source == tmp_path / "project"


def test_command_missing_workdir_names_the_field(tmp_path: Path) -> None:
    message = refusal("command", {"command": "ls", "workdir": "missing"}, tmp_path)
    assert message.startswith("task.workdir: no such folder")
    assert str(tmp_path / "missing") in message
    (tmp_path / "a-file").write_text("")
    assert "task.workdir" in refusal("command", {"command": "ls", "workdir": "a-file"}, tmp_path)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({}, "task.command: Field required"),
        ({"command": ""}, "task.command"),
        ({"command": []}, "task.command"),
        ({"command": 5}, "task.command"),
        ({"command": "ls", "env": {"A": True}}, "task.env.A"),  # numbers read as text
        ({"command": "ls", "env": ["A=1"]}, "task.env"),
        ({"command": "ls", "workdir": 3}, "task.workdir"),
        ({"command": "ls", "cwd": "x"}, "task.cwd: unknown key"),
    ],
)
def test_command_refusals_name_the_field(
    tmp_path: Path, raw: dict[str, Any], expected: str
) -> None:
    message = refusal("command", raw, tmp_path)
    assert message.startswith(f"{SOURCE}: task.")
    assert expected in message


# --- python -----------------------------------------------------------------------------------


def test_python_stages_the_scripts_folder(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('hi')\n")
    (code / "helpers.py").write_text("")
    shaped = shape(
        "python",
        {
            "script": "code/train.py",
            "args": ["--lr", "3e-4", "--name=a b"],
            "interpreter": "python3.11",
            "env": {"WANDB_MODE": "offline"},
        },
        tmp_path,
    )
    assert shaped.entrypoint == ("python3.11", "train.py", "--lr", "3e-4", "--name=a b")
    assert shaped.staged == (StagedPath(source=code, dest="workdir"),)
    assert shaped.env == {"PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline"}
    assert shaped.request["args"] == ["--lr", "3e-4", "--name=a b"]

    plain = shape("python", {"script": str(code / "train.py")}, Path("/"))
    assert plain.entrypoint == ("python3", "train.py")
    # The user may turn unbuffered output off again.
    quiet = shape("python", {"script": "code/train.py", "env": {"PYTHONUNBUFFERED": ""}}, tmp_path)
    assert quiet.env == {"PYTHONUNBUFFERED": ""}


def test_python_missing_script_names_the_field(tmp_path: Path) -> None:
    message = refusal("python", {"script": "nope.py"}, tmp_path)
    assert message.startswith("task.script: no such file")
    assert str(tmp_path / "nope.py") in message
    (tmp_path / "folder.py").mkdir()
    assert refusal("python", {"script": "folder.py"}, tmp_path).startswith("task.script")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({}, "task.script: Field required"),
        ({"script": ""}, "task.script"),
        ({"script": "t.py", "args": 5}, "task.args"),
        ({"script": "t.py", "args": "--lr 1"}, "task.args"),
        ({"script": "t.py", "args": [None]}, "task.args.0"),  # numbers read as text
        ({"script": "t.py", "interpreter": ""}, "task.interpreter"),
        ({"script": "t.py", "argv": []}, "task.argv: unknown key"),
    ],
)
def test_python_refusals_name_the_field(tmp_path: Path, raw: dict[str, Any], expected: str) -> None:
    (tmp_path / "t.py").write_text("")
    message = refusal("python", raw, tmp_path)
    assert message.startswith(f"{SOURCE}: task.")
    assert expected in message


# --- a third party's plugin -------------------------------------------------------------------


class EvalRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    benchmark: str = Field(min_length=1)
    shots: int = Field(default=0, ge=0)


class EvalTask:
    name: ClassVar[str] = "eval"
    request_model: ClassVar[type[BaseModel]] = EvalRequest

    def shape(self, request: EvalRequest, base_dir: Path) -> ShapedTask:
        return ShapedTask(
            entrypoint=("lm-eval", "--tasks", request.benchmark, "--shots", str(request.shots)),
            request=request.model_dump(),
            env={"EVAL_BASE": str(base_dir)},
            workdir="eval",
        )


def test_a_third_party_plugin_registered_through_the_constructor(tmp_path: Path) -> None:
    plugins: dict[str, type[TaskPlugin]] = {"eval": EvalTask, "command": CommandTask}
    reg = TaskRegistry(plugins)
    assert reg.names() == ["command", "eval"]
    shaped = reg.shape("eval", {"benchmark": "gsm8k", "shots": 5}, tmp_path, SOURCE)
    assert shaped.entrypoint == ("lm-eval", "--tasks", "gsm8k", "--shots", "5")
    assert shaped.request == {"benchmark": "gsm8k", "shots": 5}
    assert shaped.env == {"EVAL_BASE": str(tmp_path)}
    assert shaped.workdir == "eval"
    # Its model's refusals read like the built-ins'.
    with pytest.raises(InvalidInput, match=r"^SPEC\.yaml: task\.shots: "):
        reg.shape("eval", {"benchmark": "gsm8k", "shots": -1}, tmp_path, SOURCE)
    known = r"\(known: benchmark, critical_imports, shots, sources\)"
    with pytest.raises(InvalidInput, match=rf"^SPEC\.yaml: task\.limit: unknown key {known}$"):
        reg.shape("eval", {"benchmark": "gsm8k", "limit": 3}, tmp_path, SOURCE)
    # Only what was registered is known.
    with pytest.raises(NotFound, match=r"known: command, eval\)"):
        reg.plugin("python")


class BrokenTask(EvalTask):
    name: ClassVar[str] = "broken"

    def __init__(self) -> None:
        raise KeyError("EVAL_HOME")  # its own bug, e.g. a missing environment variable


def test_a_plugins_own_error_is_not_reported_as_an_unknown_task_type(tmp_path: Path) -> None:
    reg = TaskRegistry({"broken": BrokenTask})
    with pytest.raises(KeyError, match="EVAL_HOME"):
        reg.shape("broken", {"benchmark": "x"}, tmp_path, SOURCE)
