"""What runs beside the agents' requests: the Mailbox wakes a node's long-poll when a command
is queued for it (at once in this process, within a second from another), and Heartbeats
writes the last-seen times it gathers in one transaction a second."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from datetime import UTC, datetime

from orbit.core.control.service import CoreControlService

log = logging.getLogger("orbit.server.agents")

WATCH_EVERY_S = 0.5  # how often queues other processes filled are looked for
FLUSH_EVERY_S = 1.0  # how often gathered heartbeats are written
HISTORY_S = 3600.0  # how far back a node's GPU utilization is kept (the console's sparkline)
HISTORY_EVERY_S = 10.0  # at most one sample a node this often
HISTORY_SAMPLES = int(HISTORY_S / HISTORY_EVERY_S) + 1


class Mailbox:
    """Wakes a node's long-poll when a command is queued for it."""

    def __init__(self, service: CoreControlService) -> None:
        self.service = service
        self.loop: asyncio.AbstractEventLoop | None = None
        self.events: dict[str, asyncio.Event] = {}
        self.seen_seq = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="agent-mailbox", daemon=True)

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        with contextlib.suppress(Exception):
            self.seen_seq = self.service.store.commands.pending_nodes(0)[1]
        self.service.wakes.listen(self.wake)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.service.wakes.forget(self.wake)

    def event(self, node_id: str) -> asyncio.Event:
        return self.events.setdefault(node_id, asyncio.Event())

    def wake(self, node_id: str) -> None:
        """Thread-safe."""
        if self.loop is None:
            return
        self.loop.call_soon_threadsafe(lambda: self.event(node_id).set())

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_EVERY_S):
            try:
                nodes, self.seen_seq = self.service.store.commands.pending_nodes(self.seen_seq)
            except Exception:  # the store is away: look again next time
                continue
            for node_id in nodes:
                self.wake(node_id)


class Heartbeats:
    """Last-seen times gathered in memory and written once a second (one transaction for all
    nodes, not one per heartbeat)."""

    def __init__(self, service: CoreControlService) -> None:
        self.service = service
        self.pending: dict[str, datetime] = {}
        # each node's GPU utilization as its last heartbeat said (in memory: for /metrics),
        # and over the last hour (the console's sparklines; a restart starts them afresh)
        self.utilization: dict[str, dict[int, float]] = {}
        self.history: dict[str, deque[tuple[float, dict[int, float]]]] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-heartbeats", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()

    def seen(self, node_id: str, utilization: dict[int, float] | None = None) -> None:
        with self.lock:
            self.pending[node_id] = datetime.now(UTC)
            if utilization is not None:
                self.utilization[node_id] = utilization
                now = time.time()
                past = self.history.setdefault(node_id, deque(maxlen=HISTORY_SAMPLES))
                if not past or now - past[-1][0] >= HISTORY_EVERY_S:
                    past.append((now, utilization))
                while past and past[0][0] < now - HISTORY_S:
                    past.popleft()

    def last_utilization(self) -> dict[str, dict[int, float]]:
        with self.lock:
            return dict(self.utilization)

    def utilization_history(self, node_id: str) -> list[tuple[float, dict[int, float]]]:
        """(epoch s, GPU index -> utilization %) over the last hour, oldest first."""
        with self.lock:
            return list(self.history.get(node_id, ()))

    def flush(self) -> None:
        with self.lock:
            batch, self.pending = self.pending, {}
        if batch:
            try:
                self.service.store.heartbeats.nodes_seen(batch)
            except Exception:
                log.warning("heartbeats not written (the store?): kept for the next flush")
                with self.lock:
                    self.pending = {**batch, **self.pending}

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_EVERY_S):
            self.flush()
