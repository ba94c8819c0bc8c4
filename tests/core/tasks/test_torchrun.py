"""The `torchrun` task type: its request, what it shapes, and what is refused before anything is
frozen or started. None of this needs torch (test_torchrun_runs.py runs real jobs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orbit.core.tasks import TaskRegistry
from orbit.core.tasks.torchrun import LAUNCHER, STAGED_AS, TorchrunTask
from orbit.model.errors import InvalidInput
from orbit.model.models import ExecutionRequest
from tests.helpers import orbit, sqlite_env, write_spec

SOURCE = "SPEC.yaml"


def settings(env: dict[str, str]) -> dict[str, Any]:
    return json.loads(env["ORBIT_TORCHRUN"])


def test_a_script_is_shaped_into_the_launcher_with_its_folder_staged(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    shaped = TaskRegistry().shape(
        "torchrun",
        {"script": "train.py", "args": ["--steps", 5], "nproc_per_node": 2, "env": {"A": "1"}},
        tmp_path,
        SOURCE,
    )
    assert shaped.entrypoint == ("python3", f"../{STAGED_AS}")
    assert [(s.source, s.dest) for s in shaped.staged] == [
        (LAUNCHER, STAGED_AS),
        (tmp_path, "workdir"),
    ]
    assert shaped.env["A"] == "1"
    assert settings(shaped.env) == {
        "target": "train.py",
        "module": False,
        "args": ["--steps", "5"],
        "nproc_per_node": 2,
        "max_restarts": 0,
        "rdzv": {"backend": "static", "conf": {}},
        "join_timeout_s": 300.0,
    }


def test_a_module_runs_as_python_m_with_an_optional_workdir(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    raw = {"module": "pkg.train", "workdir": "pkg", "interpreter": "/opt/py/bin/python"}
    shaped = TaskRegistry().shape("torchrun", raw, tmp_path, SOURCE)
    assert shaped.interpreter == "/opt/py/bin/python"
    assert shaped.entrypoint[0] == "/opt/py/bin/python"
    assert [s.dest for s in shaped.staged] == [STAGED_AS, "workdir"]
    found = settings(shaped.env)
    assert (found["target"], found["module"], found["nproc_per_node"]) == (
        "pkg.train",
        True,
        "auto",
    )


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({}, "SPEC.yaml: task.module: give script (a file) or module"),
        ({"script": "t.py", "module": "m"}, "task.module: give script (a file) or module"),
        ({"script": "t.py", "workdir": "."}, "task.workdir: a script's folder is its workdir"),
        ({"module": "not a module"}, "task.module: String should match pattern"),
        ({"script": "t.py", "nproc_per_node": 0}, "task.nproc_per_node"),
        ({"script": "t.py", "nproc_per_node": "all"}, "task.nproc_per_node"),
        ({"script": "t.py", "rdzv": {"backend": "etcd"}}, "task.rdzv.backend"),
        ({"script": "t.py", "join_timeout_s": 0}, "task.join_timeout_s"),
        ({"script": "t.py", "master_port": 1}, "task.master_port: unknown key"),
        ({"script": "missing.py"}, "task.script: no such file"),
        ({"module": "m", "workdir": "nowhere"}, "task.workdir: no such folder"),
    ],
)
def test_bad_requests_say_which_field_in_one_line(
    tmp_path: Path, raw: dict[str, Any], says: str
) -> None:
    (tmp_path / "t.py").write_text("")
    with pytest.raises(InvalidInput) as info:
        TaskRegistry().shape("torchrun", raw, tmp_path, SOURCE)
    assert says in str(info.value) and "\n" not in str(info.value)


def placement(resources: dict[str, Any]) -> ExecutionRequest:
    return ExecutionRequest.model_validate(
        {
            "template_id": "t",
            "placement": {"kind": "local"},
            "launch_mode": {"kind": "host_process"},
            "target": None,
            "detach": True,
            "resources": resources,
            "runtime_env": {},
            "stop_grace_s": 10,
        }
    )


@pytest.mark.parametrize(
    ("nproc", "resources", "says"),
    [
        (4, {"gpu_count": 2}, "4 processes per node, but resources gives each node 2 GPU(s)"),
        (8, {"gpu": "H100:4"}, "but resources gives each node 4 GPU(s)"),
        (
            4,
            {"any_of": [{"gpu_count": 4}, {"gpu_count": 2}]},
            "but resources.any_of[1] gives each node 2 GPU(s)",
        ),
        (2, {"gpu_count": 2}, None),
        ("auto", {"gpu_count": 1}, None),
        (2, {"gpu_count": 0}, None),  # no GPU: the workers share the CPUs (gloo)
    ],
)
def test_more_processes_than_gpus_per_node_is_refused_at_submit(
    nproc: int | str, resources: dict[str, Any], says: str | None
) -> None:
    request = TorchrunTask.request_model.model_validate({"script": "t", "nproc_per_node": nproc})
    if says is None:
        TorchrunTask().check_placement(request, placement(resources))  # type: ignore[arg-type]
        return
    with pytest.raises(InvalidInput) as info:
        TorchrunTask().check_placement(request, placement(resources))  # type: ignore[arg-type]
    assert str(info.value).startswith("task.nproc_per_node: ") and says in str(info.value)


@pytest.mark.parametrize(
    ("task", "overrides", "says"),
    [
        (
            {"script": "train.py", "nproc_per_node": 2},
            {"resources": {"gpu_count": 1}},
            "task.nproc_per_node: 2 processes per node, but resources gives each node 1 GPU(s)",
        ),
        ({"script": "ghost.py"}, {}, "task.script: no such file"),
        ({"args": ["x"]}, {}, "task.module: give script (a file) or module"),
        ({"script": "train.py", "module": "train"}, {}, "task.module: give script"),
    ],
)
def test_bad_input_at_submit_is_one_line_exit_2_and_nothing_is_frozen(
    tmp_path: Path, task: dict[str, Any], overrides: dict[str, Any], says: str
) -> None:
    env = sqlite_env(tmp_path / "home", tmp_path / "orbit.db")
    (tmp_path / "train.py").write_text("")
    spec = write_spec(tmp_path, task_type="torchrun", task=task, overrides=overrides)
    refused = orbit(env, "submit", str(spec), check=False)
    assert refused.returncode == 2, refused
    assert refused.stderr.startswith("orbit: error: ") and says in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and refused.stdout == ""
    assert not list((tmp_path / "home").rglob("job.json"))


def run_launcher(tmp_path: Path, env: dict[str, str], **task: Any) -> subprocess.CompletedProcess:
    job = tmp_path / "bundle" / "job.json"
    job.parent.mkdir(exist_ok=True)
    job.write_text(json.dumps({"resources": {"gpu_count": 0}}))
    found = {
        "target": "train.py",
        "module": False,
        "args": [],
        "nproc_per_node": "auto",
        "max_restarts": 0,
        "rdzv": {"backend": "static", "conf": {}},
        "join_timeout_s": 5,
        **task,
    }
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "CUDA_"))}
    full = {
        **base,
        "ORBIT_TORCHRUN": json.dumps(found),
        "ORBIT_ARTIFACTS_DIR": str(tmp_path / "artifacts"),
        "ORBIT_BUNDLE_DIR": str(job.parent),
        **env,
    }
    return subprocess.run(
        [sys.executable, str(LAUNCHER)], env=full, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("env", "nproc", "says"),
    [
        (
            {"ORBIT_GPUS": "3"},
            2,
            "orbit: task.nproc_per_node: 2 processes, but this attempt has 1 GPU(s) (ORBIT_GPUS): "
            "one process per GPU at most (or nproc_per_node: auto)",
        ),
        (
            {"ORBIT_NUM_NODES": "2", "ORBIT_MASTER_PORT": "29500"},
            1,
            "orbit: ORBIT_NUM_NODES is 2, but ORBIT_MASTER_ADDR not set",
        ),
    ],
)
def test_the_node_refuses_what_only_the_node_knows_before_torchrun_starts(
    tmp_path: Path, env: dict[str, str], nproc: int, says: str
) -> None:
    """An agent node gives the attempt its GPUs at launch: more processes than those fail in
    one line before torchrun starts (torch need not even be there)."""
    done = run_launcher(tmp_path, env, nproc_per_node=nproc)
    assert done.returncode == 2
    assert done.stderr == says + "\n" and done.stdout == ""
    assert not (tmp_path / "artifacts" / "ranks").exists()
