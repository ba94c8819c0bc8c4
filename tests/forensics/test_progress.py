"""Training progress from the tails of `artifacts/**/logging.jsonl`: the pure parser on the
shapes trainers really write, and `service.progress` after a real run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from orbit.core.control.service import CoreControlService
from orbit.forensics.progress import Progress, latest_progress, parse_tail
from orbit.model.models import RunState
from tests.runtime.test_precheck import make_venv, submit, wait_all


def jsonl(*records: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def swift(step: int, loss: float | None, max_steps: int = 100, **more: Any) -> dict[str, Any]:
    """A line as ms-swift logs it."""
    record: dict[str, Any] = {"global_step/max_steps": f"{step}/{max_steps}", **more}
    if loss is not None:
        record["loss"] = loss
    return record


# --- the parser --------------------------------------------------------------------------------


def test_ms_swift_lines_give_step_max_steps_loss_and_epoch() -> None:
    tail = jsonl(
        swift(5, 1.9, epoch=0.05, learning_rate=1e-4, percentage="5.00%"),
        swift(10, 1.2, epoch=0.1, grad_norm=3.2, elapsed_time="10s", remaining_time="90s"),
    )
    found = parse_tail("artifacts/logging.jsonl", tail)
    assert found == Progress(
        file="artifacts/logging.jsonl",
        step=10,
        max_steps=100,
        loss=1.2,
        epoch=0.1,
        remaining="90s",
    )
    assert found.describe() == "step 10/100, epoch 0.1, loss 1.2, 90s left"


# as ms-swift 4.6.0 wrote them (examples/swift-sft); memory(GiB) is there on a GPU
SWIFT_460 = b"""\
{"loss": 5.88599253, "grad_norm": 1.19006693, "learning_rate": 9.33e-05, "token_acc": 0.0, \
"epoch": 0.08333333, "global_step/max_steps": "2/12", "elapsed_time": "1s", \
"remaining_time": "7s", "memory(GiB)": 3.41, "train_speed(s/it)": 0.713928}
{"train_runtime": "7.866", "train_samples_per_second": "3.051", "train_steps_per_second": \
"1.526", "train_loss": "5.887", "epoch": "0.5", "global_step/max_steps": "12/12", \
"elapsed_time": "8s", "remaining_time": "0s", "train_speed(s/it)": "0.6554"}
"""


def test_ms_swift_460_gives_step_loss_learning_rate_memory_and_time_left() -> None:
    mid = parse_tail("f", SWIFT_460.splitlines()[0])
    assert mid is not None
    assert mid.describe() == (
        "step 2/12, epoch 0.0833333, loss 5.886, lr 9.33e-05, 3.41 GiB, 7s left"
    )
    end = parse_tail("f", SWIFT_460)  # the summary line's figures are strings: its step holds
    assert end is not None
    assert (end.step, end.max_steps, end.loss, end.remaining) == (12, 12, 5.88599253, "0s")
    # the closing line of a run: global_step and the whole log history, no max_steps
    closing = {"global_step": 12, "train_loss": 5.839, "log_history": [{"loss": 5.8, "step": 12}]}
    last = parse_tail("f", SWIFT_460 + jsonl(closing))
    assert last is not None and (last.step, last.max_steps, last.loss) == (12, 12, 5.839)


def test_hf_trainer_lines_give_step_and_loss() -> None:
    tail = jsonl(
        {"loss": 2.5, "learning_rate": 5e-5, "epoch": 0.5, "step": 4},
        {"loss": 2.25, "learning_rate": 4e-5, "epoch": 0.62, "step": 5},
    )
    found = parse_tail("f", tail)
    assert found is not None
    assert (found.step, found.max_steps, found.loss, found.epoch) == (5, None, 2.25, 0.62)
    assert found.describe() == "step 5, epoch 0.62, loss 2.25, lr 4e-05"
    global_step = parse_tail("f", jsonl({"global_step": 7, "max_steps": 20, "train_loss": 0.5}))
    assert global_step is not None
    assert (global_step.step, global_step.max_steps, global_step.loss) == (7, 20, 0.5)


def test_eval_lines_without_a_loss_keep_the_last_training_loss() -> None:
    tail = jsonl(
        swift(10, 1.5, epoch=0.5),
        swift(20, 1.1, epoch=1.0),
        swift(20, None, epoch=1.0, eval_loss=1.3, eval_acc=0.6),  # ms-swift's: no "loss"
    )
    found = parse_tail("f", tail)
    assert found is not None
    assert (found.step, found.max_steps, found.loss, found.epoch) == (20, 100, 1.1, 1.0)
    hf = jsonl(
        {"loss": 0.9, "epoch": 1.0, "step": 30},
        {"eval_loss": 1.3, "eval_runtime": 2.0, "epoch": 1.0, "step": 30},
    )
    found = parse_tail("f", hf)
    assert found is not None and (found.step, found.loss) == (30, 0.9)
    # an eval at a later step than the last training line: its step, the last loss
    found = parse_tail("f", hf + jsonl({"eval_loss": 1.2, "epoch": 1.5, "step": 45}))
    assert found is not None and (found.step, found.loss, found.epoch) == (45, 0.9, 1.5)


def test_torn_lines_and_noise_are_skipped() -> None:
    lines = jsonl(swift(1, 2.0), swift(2, 1.8), swift(3, 1.6))
    # a tail cut mid-line at both ends: the first line is torn, the last is still being written
    tail = lines[7:] + b'{"global_step/max_steps": "4/100", "lo'
    found = parse_tail("f", tail)
    assert found is not None and (found.step, found.loss) == (3, 1.6)
    noisy = (
        b"Traceback (most recent call last):\n"
        + jsonl(swift(8, 0.9))
        + b"\xff\xfe not utf-8 \x00\n"
        + b"[1, 2, 3]\n"  # JSON, but not a record
        + b"42\n"
        + jsonl({"note": "no step or loss here"})
        + b"\n"
        + b"   \n"
    )
    found = parse_tail("f", noisy)
    assert found is not None and (found.step, found.loss) == (8, 0.9)
    assert parse_tail("f", b"") is None
    assert parse_tail("f", b"no json at all\n{torn") is None


def test_the_file_furthest_along_wins() -> None:
    tails = {
        "artifacts/a/logging.jsonl": jsonl(swift(30, 0.8), swift(40, 0.7)),
        "artifacts/b/logging.jsonl": jsonl({"step": 55, "loss": 0.6}),
        "artifacts/c/logging.jsonl": jsonl(swift(10, 1.0)),
        "artifacts/d/logging.jsonl": b"garbage\n",
    }
    found = latest_progress(tails)
    assert found is not None
    assert (found.file, found.step, found.loss) == ("artifacts/b/logging.jsonl", 55, 0.6)
    assert latest_progress({}) is None
    assert latest_progress({"x": b"nothing\n"}) is None


@given(
    losses=st.lists(st.floats(0.01, 10, allow_nan=False), min_size=1, max_size=30),
    cut=st.tuples(st.integers(0, 4000), st.integers(0, 4000)),
)
def test_any_cut_of_a_log_gives_a_step_it_logged_or_nothing(
    losses: list[float], cut: tuple[int, int]
) -> None:
    raw = jsonl(*(swift(i, loss, max_steps=len(losses)) for i, loss in enumerate(losses, 1)))
    start, end = sorted(cut)
    found = parse_tail("f", raw[start:end])
    if found is not None:
        assert found.step is not None and 1 <= found.step <= len(losses)
        assert found.loss == losses[found.step - 1]
        assert found.max_steps == len(losses)


# --- end to end --------------------------------------------------------------------------------

TASK_PY = """\
import json, os, pathlib
art = pathlib.Path(os.environ["ORBIT_ARTIFACTS_DIR"])
with open(art / "logging.jsonl", "w") as f:
    for step in range(1, 13):
        line = {"loss": round(2.0 - step / 10, 3), "epoch": step / 12,
                "global_step/max_steps": f"{step}/120"}
        f.write(json.dumps(line) + "\\n")
    eval_line = {"eval_loss": 0.99, "epoch": 1.0, "global_step/max_steps": "12/120"}
    f.write(json.dumps(eval_line) + "\\n")
    f.write('{"loss": 0.7, "global_st')  # the trainer was writing its next line
(art / "eval").mkdir()
(art / "eval" / "logging.jsonl").write_text(json.dumps({"step": 3, "loss": 5.0}) + "\\n")
"""


def test_progress_after_a_real_run_shows_its_last_step_and_loss(
    service: CoreControlService, tmp_path: Path
) -> None:
    python = make_venv(tmp_path / "venv")
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "task.py").write_text(TASK_PY)
    run = submit(
        service, tmp_path, "python", {"script": "proj/task.py", "interpreter": str(python)}
    )
    quiet = submit(service, tmp_path, "command", {"command": "true"})
    run, quiet = wait_all(service, [run, quiet])
    assert run.state is RunState.SUCCEEDED, run.current.message
    found = service.progress(run)
    assert found == Progress(
        file="artifacts/logging.jsonl", step=12, max_steps=120, loss=0.8, epoch=1.0
    )
    assert service.progress(run, attempt=1) == found
    assert service.progress(quiet) is None  # logged nothing: no progress, no error
