"""Small helpers shared by the service and CLI tests: spec files and polling."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


def write_spec(folder: Path, name: str = "spec.yaml", **fields: Any) -> Path:
    """A SPEC.yaml for `orbit submit`; defaults to a quick `command` task on the local template."""
    data: dict[str, Any] = {
        "experiment": "exp",
        "task_type": "command",
        "template": "local",
        "task": {"command": "echo hello"},
    }
    data.update(fields)
    path = folder / name
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def eventually(check: Callable[[], T | None], timeout: float = 20.0, every: float = 0.05) -> T:
    """Poll `check` until it returns something truthy, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {value!r})")
        time.sleep(every)
