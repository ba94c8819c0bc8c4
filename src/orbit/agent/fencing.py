"""A node cut off from the control plane stops its own work (as Nomad's
stop_after_client_disconnect does): the server gives a silent node's attempts up after its lost
timeout and retries them elsewhere, so an attempt that ran on would run beside its retry, two
copies of one training job writing checkpoints for the same run.

The agent counts from its last answer from the server. Past `fence_after_s` (the server's lost
timeout, said at every sync and heartbeat; None: never) it asks each of its running attempts to
stop, with at most FENCE_STOP_S of grace; the server's retry of a lost attempt waits that long
and a heartbeat more (orbit.model.config). It also keeps the time of that last answer in a
file beside the attempts (the mtime of attempts/.agent-contact), which every wrapper it starts
watches: a wrapper whose agent is gone, or cut off, that long stops its task by itself
(orbit.runtime.wrapper), a few seconds after the agent would have.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from orbit.model.config import FENCE_STOP_S

log = logging.getLogger("orbit.agent")

CONTACT_FILE = ".agent-contact"
TOUCH_EVERY_S = 1.0


class Fence:
    def __init__(self, attempts_dir: Path) -> None:
        self.contact_file = attempts_dir / CONTACT_FILE
        self.fence_after_s: float | None = None
        self.last_contact = time.monotonic()
        self.touched = 0.0
        self.fenced: set[str] = set()
        self.lock = threading.Lock()

    def heard(self) -> None:
        """An answer from the server: the clock starts again (and wrappers are told)."""
        now = time.monotonic()
        self.last_contact = now
        if now - self.touched >= TOUCH_EVERY_S:
            self.touched = now
            self._touch()

    def _touch(self) -> None:
        try:
            with open(self.contact_file, "a"):
                pass
            os.utime(self.contact_file)
            os.chmod(self.contact_file, 0o644)  # a task's wrapper (any user) reads its mtime
        except OSError as exc:
            log.warning("cannot mark contact with the server in %s: %s", self.contact_file, exc)

    def told(self, fence_after_s: float | None) -> None:
        self.fence_after_s = fence_after_s

    def cut_off(self) -> bool:
        """Silent past the fence: the server has given this node's attempts up."""
        return self.fence_after_s is not None and self.silent_s() >= self.fence_after_s

    def silent_s(self) -> float:
        return time.monotonic() - self.last_contact

    def due(self, running: list[str]) -> list[str]:
        """The attempts to stop now: running ones, not stopped before, once the server has
        been silent past the fence. Contact again forgets what was stopped."""
        with self.lock:
            if not self.cut_off():
                self.fenced.clear()
                return []
            todo = [a for a in running if a not in self.fenced]
            self.fenced.update(todo)
        if todo:
            log.error(
                "no word from the server for %.0fs (it gives a silent node's attempts up after "
                "%.0fs and retries them elsewhere): stopping %s so that they do not run beside "
                "their retries",
                self.silent_s(),
                self.fence_after_s,
                ", ".join(todo),
            )
        return todo

    def wrapper_env(self) -> dict[str, str]:
        """What a wrapper needs to stop its task by itself when its agent is gone."""
        if self.fence_after_s is None:
            return {}
        return {
            "ORBIT_AGENT_CONTACT": str(self.contact_file),
            "ORBIT_FENCE_AFTER_S": f"{self.fence_after_s:g}",
            "ORBIT_FENCE_STOP_S": f"{FENCE_STOP_S:g}",
        }
