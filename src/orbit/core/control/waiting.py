"""Waiting for a run to end: asking again until it has, the same whichever side of the network
the control plane is on (CoreControlService in this process, RemoteControl over HTTP)."""

from __future__ import annotations

import time
from collections.abc import Callable

from orbit.model.records import RunRecord


def wait_until_ended(
    look: Callable[[str], RunRecord], ref: str, timeout_s: float | None, poll_s: float
) -> RunRecord:
    """The run once `look` finds it ended, or as it stands after `timeout_s` seconds."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        run = look(ref)
        if run.state.terminal or (deadline is not None and time.monotonic() >= deadline):
            return run
        time.sleep(poll_s)
