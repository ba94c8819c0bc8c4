"""Training progress from `artifacts/**/logging.jsonl`, the JSON-lines form trainers such as
ms-swift and HF Trainer log in. Pure: it reads the tail bytes a backend hands it."""

from __future__ import annotations

import json
import math
from typing import Any

from orbit.model.models import Record

PROGRESS_GLOB = "artifacts/**/logging.jsonl"
TAIL_BYTES = 64 * 1024


class Progress(Record):
    file: str
    step: int | None = None
    max_steps: int | None = None
    loss: float | None = None
    epoch: float | None = None
    # what ms-swift adds: learning_rate, memory(GiB), remaining_time (its own words: "1m 5s")
    learning_rate: float | None = None
    memory_gib: float | None = None
    remaining: str | None = None
    # what an evaluation adds (the affinetes task's): the mean score so far, tasks failed
    score: float | None = None
    failed: int | None = None

    def describe(self) -> str:
        parts = []
        if self.step is not None:
            parts.append(f"step {self.step}" + (f"/{self.max_steps}" if self.max_steps else ""))
        if self.epoch is not None:
            parts.append(f"epoch {self.epoch:g}")
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4g}")
        if self.learning_rate is not None:
            parts.append(f"lr {self.learning_rate:.3g}")
        if self.memory_gib is not None:
            parts.append(f"{self.memory_gib:g} GiB")
        if self.remaining:
            parts.append(f"{self.remaining} left")
        if self.score is not None:
            parts.append(f"mean score {self.score:.4g}")
        if self.failed:
            parts.append(f"{self.failed} failed")
        return ", ".join(parts)


def _number(value: Any) -> float | None:
    """A finite number, or None (a diverged run's NaN ranks nowhere)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _text(value: Any) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


def _step(record: dict[str, Any]) -> tuple[int | None, int | None]:
    """`step` or `global_step`, or ms-swift's `"global_step/max_steps": "10/100"`."""
    both = record.get("global_step/max_steps")
    if isinstance(both, str) and "/" in both:
        head, _, tail = both.partition("/")
        if head.strip().isdigit() and tail.strip().isdigit():
            return int(head), int(tail)
    for key in ("step", "global_step"):
        value = _number(record.get(key))
        if value is not None:
            max_steps = _number(record.get("max_steps"))
            return int(value), int(max_steps) if max_steps else None
    return None, None


def parse_tail(file: str, tail: bytes) -> Progress | None:
    """The newest line that says a step or a loss. Torn first or last lines are skipped."""
    latest: Progress | None = None
    for line in reversed(tail.splitlines()):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        step, max_steps = _step(record)
        loss = _number(record.get("loss", record.get("train_loss")))
        if step is None and loss is None:
            continue
        if latest is None:
            latest = Progress(
                file=file,
                step=step,
                max_steps=max_steps,
                loss=loss,
                epoch=_number(record.get("epoch")),
                learning_rate=_number(record.get("learning_rate")),
                memory_gib=_number(record.get("memory(GiB)")),
                remaining=_text(record.get("remaining_time")),
                score=_number(record.get("score")),
                failed=None if (n := _number(record.get("failed"))) is None else int(n),
            )
        if latest.loss is None and loss is not None:  # eval lines carry no training loss
            latest = latest.model_copy(update={"loss": loss})
        if latest.max_steps is None and max_steps and max_steps >= (latest.step or 0):
            # ms-swift's closing line (global_step, its whole log_history) says no max_steps
            latest = latest.model_copy(update={"max_steps": max_steps})
        if latest.loss is not None and (latest.max_steps is not None or latest.step is None):
            break
    return latest


def latest_progress(tails: dict[str, bytes]) -> Progress | None:
    """Across every logging.jsonl: the one furthest along."""
    found = [p for name, tail in sorted(tails.items()) if (p := parse_tail(name, tail))]
    return max(found, key=lambda p: p.step or 0, default=None)


def latest_value(tails: dict[str, bytes], metric: str) -> tuple[float, int | None] | None:
    """The newest number `metric` has in any logging.jsonl tail, with its line's step: the
    file furthest along wins. None if no line says it."""
    best: tuple[float, int | None] | None = None
    for _, tail in sorted(tails.items()):
        for line in reversed(tail.splitlines()):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            value = _number(record.get(metric)) if isinstance(record, dict) else None
            if value is None:
                continue
            step = _step(record)[0]
            if best is None or (step or 0) > (best[1] or 0):
                best = (value, step)
            break
    return best
