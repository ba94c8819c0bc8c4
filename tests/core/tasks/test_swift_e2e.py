"""The `swift` task type with real ms-swift (from .venv-swift: tools/swift-venv.sh), on a CPU:
examples/swift-sft's tiny random Qwen2 fine-tuned with LoRA through ORBIT. Progress comes
from swift's own logging.jsonl, a cancel stops every process of the attempt, a checkpoint is
collected, and the next attempt goes on from it (as a retry or a preemption's would: the
checkpoint staged beside it, the wrapper hands it on, swift resumes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from orbit.core.control.service import CoreControlService
from orbit.forensics.progress import Progress, latest_progress
from orbit.model.models import RunState
from orbit.runtime.checkpoint_finder import newest_checkpoint
from tests.helpers import eventually
from tests.runtime.test_precheck import attempt_dir, submit

pytestmark = pytest.mark.swift

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "swift-sft"
PYTHON = ROOT / ".venv-swift" / "bin" / "python"
STEPS, SAVE_EVERY = 40, 4


@pytest.fixture
def example(tmp_path: Path) -> Path:
    """The example's folder with its model made, or a skip without .venv-swift (a failure
    with ORBIT_REQUIRE_SWIFT=1, as on CI)."""
    if not (PYTHON.parent / "swift").exists():
        if os.environ.get("ORBIT_REQUIRE_SWIFT") == "1":
            pytest.fail(
                "ORBIT_REQUIRE_SWIFT=1 but .venv-swift has no swift: run tools/swift-venv.sh"
            )
        pytest.skip("no .venv-swift (tools/swift-venv.sh makes it)")
    folder = tmp_path / "swift-sft"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("model"))
    subprocess.run([str(PYTHON), "make_model.py"], cwd=folder, check=True, capture_output=True)
    return folder


def request(example: Path) -> dict[str, Any]:
    import yaml

    spec = yaml.safe_load((example / "spec.yaml").read_text())
    task: dict[str, Any] = spec["task"]
    task["workdir"] = "swift-sft"
    task["interpreter"] = str(PYTHON)
    task["args"].update(max_steps=STEPS, save_steps=SAVE_EVERY)
    return task


def processes_of(attempt: Path) -> list[int]:
    """Every process whose environment says it is this attempt's task (swift, its training
    child): the wrapper sets ORBIT_ARTIFACTS_DIR for the task only."""
    mark = f"ORBIT_ARTIFACTS_DIR={attempt / 'artifacts'}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if mark in environ and state != "Z":
            found.append(int(pid))
    return found


def progress_of(artifacts: Path) -> Progress | None:
    tails = {str(p): p.read_bytes() for p in artifacts.glob("**/logging.jsonl")}
    return latest_progress(tails)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_swift_sft_through_orbit_progress_cancel_collect_and_resume(
    service: CoreControlService, example: Path, tmp_path: Path
) -> None:
    run = submit(service, tmp_path, "swift", request(example))
    first = attempt_dir(run)

    def checkpointed() -> Progress | None:
        found = service.progress(service.refresh_run_status(run.id))
        saved = list((first / "artifacts" / "checkpoints").glob("v0-*/checkpoint-*"))
        return found if saved and found and found.step and found.step > SAVE_EVERY else None

    seen = eventually(checkpointed, 240, every=0.2)
    assert seen.max_steps == STEPS and seen.loss is not None and seen.learning_rate is not None
    assert "left" in seen.describe()  # swift's remaining_time
    task = processes_of(first)
    assert len(task) >= 2, task  # swift and its training child

    ended = service.cancel_run(run.id, wait_s=60)
    assert ended.state is RunState.TERMINATED, ended.current.message
    assert not [pid for pid in task if Path(f"/proc/{pid}").exists() and pid in processes_of(first)]
    log = (first / "artifacts" / "training.log").read_text()
    assert '"CUDA_VISIBLE_DEVICES": ""' in log  # a CPU attempt: no GPU visible to swift
    precheck = (first / "artifacts" / "runtime-precheck.log").read_text()
    assert "ok       swift 4.6.0 from " in precheck and "precheck passed" in precheck
    stopped_at = progress_of(first / "artifacts")
    assert stopped_at is not None and stopped_at.step is not None and stopped_at.step < STEPS

    collected = tmp_path / "collected"
    service.collect_run_artifacts(run.id, collected)
    relpath = newest_checkpoint(str(first / "artifacts"))
    assert relpath is not None and relpath.startswith("checkpoints/v0-")
    step = int(relpath.rsplit("-", 1)[1])
    assert step % SAVE_EVERY == 0
    assert list(collected.glob(f"**/{Path(relpath).name}/adapter_model.safetensors")), relpath

    # the next attempt: the bundle again in a folder of its own, the checkpoint staged beside
    second = tmp_path / "attempt-2"
    second.mkdir()
    for part in ("job.json", "inputs", "scripts"):
        copy = shutil.copytree if (first / part).is_dir() else shutil.copy2
        copy(first / part, second / part)
    staged = tmp_path / "staged-checkpoint"
    shutil.copytree(first / "artifacts" / relpath, staged)
    env = {**os.environ, "ORBIT_RESUME_STAGED": str(staged), "ORBIT_RESUME_RELPATH": relpath}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    subprocess.run(["bash", str(second / "scripts" / "run.sh")], env=env, check=True, timeout=600)
    result = json.loads((second / "runtime" / "result.json").read_text())
    assert result["state"] == "succeeded", result
    resumed = (second / "artifacts" / "training.log").read_text()
    assert f"--resume_from_checkpoint {second / 'artifacts' / relpath}" in resumed
    (run_folder,) = (second / "artifacts" / "checkpoints").glob("v1-*")  # a resume: vN+1
    lines = map(json.loads, (run_folder / "logging.jsonl").read_text().splitlines())
    steps = [int(r["global_step/max_steps"].split("/")[0]) for r in lines if "loss" in r]
    assert steps[0] == step + 1 and steps[-1] == STEPS  # on from the checkpoint, to the end
    done = progress_of(second / "artifacts")
    assert done is not None and (done.step, done.max_steps) == (STEPS, STEPS)
