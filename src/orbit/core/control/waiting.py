"""Waiting for a run to end: asking again until it has, the same whichever side of the network
the control plane is on (CoreControlService in this process, RemoteControl over HTTP)."""

from __future__ import annotations

import time

from orbit.model.records import RunRecord


class WaitsForRuns:
    def refresh_run_status(self, ref: str) -> RunRecord:
        raise NotImplementedError

    def wait_for(self, ref: str, timeout_s: float | None = None, poll_s: float = 0.5) -> RunRecord:
        """The run once it ended, or as it stands after `timeout_s` seconds."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            run = self.refresh_run_status(ref)
            if run.state.terminal or (deadline is not None and time.monotonic() >= deadline):
                return run
            time.sleep(poll_s)
