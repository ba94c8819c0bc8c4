"""The layered logs a run leaves, each answering one question (see README, "After the fact").
Stdlib only: the CLI names them in its options without loading the rest of ORBIT."""

from __future__ import annotations

from enum import StrEnum


class LogLayer(StrEnum):
    RUNTIME = "runtime"  # did the wrapper stage and start?
    TRAINING = "training"  # the task's stdout and stderr

    @property
    def relpath(self) -> str:
        return {"runtime": "runtime/runtime.log", "training": "artifacts/training.log"}[self.value]
