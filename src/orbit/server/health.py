"""/healthz: the store answers, and the disks the server writes to have room. Looked at on
threads of its own (never those that serve the API, however busy they are), and answered
unhealthy when the store does not answer in time rather than after it does."""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
from anyio import CapacityLimiter

from orbit.core.control.service import CoreControlService
from orbit.model.config import Settings
from orbit.model.errors import StoreError
from orbit.store.drivers import sqlite_path

ANSWER_WITHIN_S = 5.0  # a store slower than this to count runs is not healthy
MiB = 1024 * 1024


class Health:
    def __init__(
        self, service: CoreControlService, settings: Settings, min_free_disk_mb: int
    ) -> None:
        self.service = service
        self.min_free = min_free_disk_mb * MiB
        # by name, never by path: the answer goes to anyone who asks
        self.disks: list[tuple[str, Path]] = [("ORBIT_HOME", settings.home)]
        store = sqlite_path(service.store.url)
        if store is not None:
            self.disks.append(("the SQLite store", store.parent))
        self.threads = CapacityLimiter(2)

    async def problem(self) -> str | None:
        """What is wrong, in one line; None: healthy."""
        with anyio.move_on_after(ANSWER_WITHIN_S):
            return await anyio.to_thread.run_sync(
                self._look, limiter=self.threads, abandon_on_cancel=True
            )
        return f"store unhealthy: it did not answer within {ANSWER_WITHIN_S:.0f} s"

    def _look(self) -> str | None:
        try:
            self.service.store.runs.count_runs(states=set())
        except StoreError as exc:
            return f"store unhealthy: {exc.first_line}"
        for name, folder in self.disks:
            try:
                free = shutil.disk_usage(folder).free
            except OSError as exc:
                return f"store unhealthy: the disk of {name} cannot be read ({exc.strerror})"
            if free < self.min_free:
                return (
                    f"store unhealthy: the disk of {name} is full ({free // MiB} MiB free, "
                    f"less than min_free_disk_mb: {self.min_free // MiB})"
                )
        return None
