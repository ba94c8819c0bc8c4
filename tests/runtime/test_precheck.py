"""The precheck, end to end: real runs whose task interpreter is a real virtual environment made
here with `python -m venv`, so what the precheck records is what that interpreter loads."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from orbit.core.control.service import CoreControlService
from orbit.model.errors import InvalidInput
from orbit.model.models import FailureKind, FailureReason, RunState, TaskSubmission
from orbit.model.records import RunRecord

COMMIT = "0123456789abcdef0123456789abcdef01234567"
PACKAGES = "importlib.metadata"

# A task that proves it ran by writing the file named by its first argument.
TASK_PY = """\
import pathlib, sys
pathlib.Path(sys.argv[1]).write_text("ran")
for name in sys.argv[2:]:
    print(name, __import__(name).__file__, flush=True)
"""


# --- helpers, shared with tests/test_inspect_and_diff.py ---------------------------------------


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def install(site: Path, name: str, version: str, *, version_attr: bool = True) -> Path:
    """A little package with its dist-info, written straight into `site`; its __init__.py."""
    package = site / name
    package.mkdir(parents=True)
    init = package / "__init__.py"
    init.write_text(f'__version__ = "{version}"\n' if version_attr else "WHERE = 'venv'\n")
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(f"{name}\n")
    (info / "INSTALLER").write_text("orbit-tests\n")
    (info / "RECORD").write_text(f"{name}/__init__.py,,\n{info.name}/METADATA,,\n")
    return init


def make_venv(where: Path, packages: dict[str, str] | None = None) -> Path:
    """A real venv without pip, with `packages` (name -> version) installed; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    for name, version in (packages or {}).items():
        install(site_packages(where), name, version)
    return where / "bin" / "python"


def write_task(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "task.py"
    script.write_text(TASK_PY)
    return script


def submit(
    service: CoreControlService,
    base_dir: Path,
    task_type: str,
    task_request: dict[str, Any],
    **fields: Any,
) -> RunRecord:
    data: dict[str, Any] = {
        "experiment_id": "exp",
        "task_type": task_type,
        "task_request": task_request,
        "template_id": "local",
        **fields,
    }
    return service.submit_task(TaskSubmission.model_validate(data), base_dir=base_dir)


def wait_all(service: CoreControlService, runs: Iterable[RunRecord]) -> list[RunRecord]:
    done = [service.wait_for(r.id, timeout_s=60, poll_s=0.05) for r in runs]
    assert all(r.state.terminal for r in done), [(r.id, r.state) for r in done]
    return done


def attempt_dir(run: RunRecord) -> Path:
    assert run.current.handle is not None
    return Path(run.current.handle.location)


def precheck_report(run: RunRecord) -> dict[str, Any]:
    data = json.loads((attempt_dir(run) / "runtime" / "precheck.json").read_text())
    assert isinstance(data, dict)
    return data


def precheck_log(run: RunRecord) -> str:
    return (attempt_dir(run) / "artifacts" / "runtime-precheck.log").read_text()


def host_has_gpu() -> bool:
    return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None


# --- what a passing precheck records -----------------------------------------------------------


def test_the_precheck_records_what_the_tasks_own_interpreter_loads(
    service: CoreControlService, tmp_path: Path
) -> None:
    python = make_venv(tmp_path / "venv", {"orbitdep": "1.2.3"})
    site = site_packages(tmp_path / "venv")
    install(site, "metaonly", "0.4.0", version_attr=False)  # its version only in the metadata
    write_task(tmp_path / "proj")
    marker = tmp_path / "ran"
    run = submit(
        service,
        tmp_path,
        "python",
        {
            "script": "proj/task.py",
            "args": [str(marker), "orbitdep"],
            "interpreter": str(python),
            "critical_imports": ["orbitdep", "metaonly"],
        },
    )
    # The same in ORBIT's own interpreter: its package list reads as `pip freeze` writes it,
    # an editable install (PEP 610's direct_url.json) included.
    with_pip = submit(
        service,
        tmp_path,
        "python",
        {
            "script": "proj/task.py",
            "args": [str(tmp_path / "ran-2")],
            "interpreter": sys.executable,
        },
    )
    run, with_pip = wait_all(service, [run, with_pip])
    assert run.state is RunState.SUCCEEDED, run.current.message
    assert marker.read_text() == "ran"

    report = precheck_report(run)
    assert report["ok"] is True
    orbitdep = os.path.realpath(site / "orbitdep" / "__init__.py")
    metaonly = os.path.realpath(site / "metaonly" / "__init__.py")
    assert report["critical_imports"] == [
        {"name": "orbitdep", "ok": True, "version": "1.2.3", "path": orbitdep},
        {"name": "metaonly", "ok": True, "version": "0.4.0", "path": metaonly},
    ]
    assert report["python"] == {
        "version": platform.python_version(),
        "executable": str(python),
        "prefix": str(tmp_path / "venv"),
    }
    assert report["distributions"]["source"] == PACKAGES
    assert {"orbitdep==1.2.3", "metaonly==0.4.0"} <= set(report["distributions"]["lines"])
    assert report["host"]["hostname"] == socket.gethostname()
    assert report["host"]["kernel"] == platform.release()
    gpus = report["gpus"]
    if not gpus["present"]:
        assert gpus["reason"]  # says why, and the run went on
    if not host_has_gpu():
        assert gpus["present"] is False
    assert report["forks"] == []

    log = precheck_log(run)
    assert f"python {platform.python_version()} at {python}" in log
    assert f"ok       orbitdep 1.2.3 from {orbitdep}" in log
    assert f"ok       metaonly 0.4.0 from {metaonly}" in log
    assert f"kernel {platform.release()}" in log and socket.gethostname() in log
    assert f"packages ({PACKAGES}):\n" in log and "  orbitdep==1.2.3\n" in log
    if not gpus["present"]:
        assert f"gpus     none ({gpus['reason']})" in log
    assert log.endswith("precheck passed\n")
    # the task saw the very file the precheck recorded
    training = (attempt_dir(run) / "artifacts" / "training.log").read_text()
    assert f"orbitdep {site / 'orbitdep' / '__init__.py'}" in training
    runtime_log = (attempt_dir(run) / "runtime" / "runtime.log").read_text()
    assert runtime_log.index(f"precheck with {python}") < runtime_log.index("precheck passed")
    assert runtime_log.index("precheck passed") < runtime_log.index("starting task")

    assert with_pip.state is RunState.SUCCEEDED, with_pip.current.message
    packages = precheck_report(with_pip)["distributions"]
    assert packages["source"] == PACKAGES
    assert f"pydantic=={importlib.metadata.version('pydantic')}" in packages["lines"]
    orbit_line = f"  # orbit-control-plane=={importlib.metadata.version('orbit-control-plane')}"
    editable = [line for line in packages["lines"] if line.endswith(orbit_line)]
    assert editable and editable[0].startswith("-e /"), packages["lines"]
    # Nothing to gate there (no critical imports, no staged fork): the precheck ran beside the
    # task, which did not wait for it, and its record is sealed in the manifest all the same.
    steps = (attempt_dir(with_pip) / "runtime" / "runtime.log").read_text()
    assert steps.index("starting task") < steps.index("precheck passed")
    manifest = json.loads((attempt_dir(with_pip) / "artifacts" / "manifest.json").read_text())
    assert "runtime-precheck.log" in {f["path"] for f in manifest["files"]}


# --- a missing dependency ----------------------------------------------------------------------


def test_a_missing_dependency_fails_the_run_before_the_task_starts(
    service: CoreControlService, tmp_path: Path
) -> None:
    python = make_venv(tmp_path / "venv", {"orbitdep": "1.0"})
    write_task(tmp_path / "proj")
    marker = tmp_path / "ran"
    run = submit(
        service,
        tmp_path,
        "python",
        {
            "script": "proj/task.py",
            "args": [str(marker)],
            "interpreter": str(python),
            "critical_imports": ["orbitdep", "nowhere_to_be_found.sub"],
        },
    )
    (run,) = wait_all(service, [run])
    assert not marker.exists()  # the task never started
    assert run.state is RunState.FAILED
    assert len(run.attempts) == 1  # an environment failure: not retried automatically
    attempt = run.current
    assert attempt.reason is FailureReason.DEPENDENCY_MISSING
    assert attempt.reason.kind is FailureKind.ENVIRONMENT
    assert attempt.exit_code is None
    assert "nowhere_to_be_found.sub" in (attempt.message or "")
    assert "orbitdep" not in (attempt.message or "")

    imports = precheck_report(run)["critical_imports"]
    assert [(i["name"], i["ok"]) for i in imports] == [
        ("orbitdep", True),
        ("nowhere_to_be_found.sub", False),
    ]
    assert "No module named 'nowhere_to_be_found'" in imports[1]["error"]
    log = precheck_log(run)
    assert "ok       orbitdep 1.0 from " in log
    assert "MISSING  nowhere_to_be_found.sub: ModuleNotFoundError" in log
    assert log.endswith("precheck FAILED\n")
    runtime_log = (attempt_dir(run) / "runtime" / "runtime.log").read_text()
    assert "precheck failed: missing dependencies: nowhere_to_be_found.sub" in runtime_log
    assert "starting task" not in runtime_log
    assert not (attempt_dir(run) / "artifacts" / "training.log").exists()


# --- staged forks ------------------------------------------------------------------------------


def stage_fork(folder: Path, manifest: str | None = None) -> Path:
    """A command task's workdir holding fork/FORK_MANIFEST.json and fork/forkpkg/."""
    fork = folder / "fork"
    (fork / "forkpkg").mkdir(parents=True)
    (fork / "forkpkg" / "__init__.py").write_text('__version__ = "1.0+fork"\n')
    if manifest is None:
        manifest = json.dumps(
            {"package": "forkpkg", "upstream_commit": COMMIT, "patch_digest": "sha256:" + "ab" * 32}
        )
    (fork / "FORK_MANIFEST.json").write_text(manifest)
    return folder


def fork_task(venv: Path, workdir: str, marker: Path, **env: str) -> dict[str, Any]:
    """`python3` here is the venv's, found on the job's PATH: the task's and the precheck's."""
    code = "import forkpkg, pathlib, sys; pathlib.Path(sys.argv[1]).write_text(forkpkg.__file__)"
    return {
        "command": ["python3", "-c", code, str(marker)],
        "workdir": workdir,
        "env": {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", **env},
    }


def test_a_staged_fork_must_be_the_copy_the_interpreter_loads(
    service: CoreControlService, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    make_venv(venv, {"forkpkg": "1.0"})  # the same package name, installed in the venv
    installed = os.path.realpath(site_packages(venv) / "forkpkg" / "__init__.py")
    stage_fork(tmp_path / "proj")
    stage_fork(tmp_path / "broken", manifest='{"package": "forkpkg", ')
    unpinned = json.dumps({"package": "forkpkg", "upstream_commit": "main", "patch_digest": "x"})
    stage_fork(tmp_path / "unpinned", manifest=unpinned)
    marks = {name: tmp_path / f"ran-{name}" for name in ("ok", "shadowed", "broken", "unpinned")}
    runs = [
        submit(
            service,
            tmp_path,
            "command",
            {
                **fork_task(venv, "proj", marks["ok"], PYTHONPATH="fork"),  # relative to the cwd
                "critical_imports": ["forkpkg"],
            },
        ),
        submit(service, tmp_path, "command", fork_task(venv, "proj", marks["shadowed"])),
        submit(
            service,
            tmp_path,
            "command",
            fork_task(venv, "broken", marks["broken"], PYTHONPATH="fork"),
        ),
        submit(
            service,
            tmp_path,
            "command",
            fork_task(venv, "unpinned", marks["unpinned"], PYTHONPATH="fork"),
        ),
    ]
    ok, shadowed, broken, unpinned_run = wait_all(service, runs)
    manifest_rel = "inputs/workdir/fork/FORK_MANIFEST.json"

    # loaded from the staged fork: the precheck passes and says so
    assert ok.state is RunState.SUCCEEDED, ok.current.message
    fork_dir = os.path.realpath(attempt_dir(ok) / "inputs" / "workdir" / "fork")
    in_fork = os.path.join(fork_dir, "forkpkg", "__init__.py")
    assert os.path.realpath(marks["ok"].read_text()) == in_fork  # the task saw the same
    report = precheck_report(ok)
    (fork,) = report["forks"]
    assert fork["ok"] is True and "error" not in fork
    assert fork["manifest"] == manifest_rel
    assert fork["package"] == "forkpkg"
    assert fork["upstream_commit"] == COMMIT
    assert fork["patch_digest"] == "sha256:" + "ab" * 32
    assert fork["fork_dir"] == fork_dir
    assert fork["loaded"]["path"] == in_fork
    assert report["critical_imports"][0]["version"] == "1.0+fork"
    assert f"ok       fork {manifest_rel}: forkpkg loaded from {in_fork}" in precheck_log(ok)

    # the venv's copy shadows it: the run fails before the task starts, naming both paths
    assert not marks["shadowed"].exists()
    assert shadowed.state is RunState.FAILED and len(shadowed.attempts) == 1
    assert shadowed.current.reason is FailureReason.DEPENDENCY_MISMATCH
    assert shadowed.current.reason.kind is FailureKind.ENVIRONMENT
    message = shadowed.current.message or ""
    shadow_fork_dir = os.path.realpath(attempt_dir(shadowed) / "inputs" / "workdir" / "fork")
    assert installed in message and shadow_fork_dir in message and manifest_rel in message
    log = precheck_log(shadowed)
    assert f"MISMATCH fork {manifest_rel}: package 'forkpkg' is loaded from {installed}" in log
    assert shadow_fork_dir in log and log.endswith("precheck FAILED\n")
    (fork,) = precheck_report(shadowed)["forks"]
    assert fork["ok"] is False and fork["loaded"]["path"] == installed

    # a manifest that does not parse: a clear failure that names the manifest
    assert not marks["broken"].exists()
    assert broken.state is RunState.FAILED and len(broken.attempts) == 1
    assert broken.current.reason is FailureReason.DEPENDENCY_MISMATCH
    assert f"{manifest_rel} does not parse" in (broken.current.message or "")
    assert f"MISMATCH fork {manifest_rel} does not parse: JSONDecodeError" in precheck_log(broken)

    # a manifest not pinned to a 40-character commit
    assert not marks["unpinned"].exists()
    assert unpinned_run.current.reason is FailureReason.DEPENDENCY_MISMATCH
    assert "upstream_commit 'main' is not a 40-character hex commit" in (
        unpinned_run.current.message or ""
    )


# --- refused at submit -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "where"),
    [
        (["torch>=2"], r"task\.critical_imports\.0: 'torch>=2' is not an import name"),
        (["not a name"], r"task\.critical_imports\.0: 'not a name' is not an import name"),
        (5, r"task\.critical_imports: Input should be a valid list"),
    ],
)
def test_bad_critical_imports_are_refused_at_submit_and_write_nothing(
    service: CoreControlService, tmp_path: Path, value: object, where: str
) -> None:
    with pytest.raises(InvalidInput, match=where):
        submit(service, tmp_path, "command", {"command": "true", "critical_imports": value})
    assert service.list_runs() == []
    assert service.list_experiments() == []
    assert service.audit() == []
    assert not service.bundles_dir.exists() or not any(service.bundles_dir.iterdir())
