"""XID events, watched for as long as the agent runs.

NVML tells of an XID (the driver's report of a GPU fault) only to an event set registered before
it happened, so a one-off look at the node cannot see one: a thread keeps an event set open and
waits on it. An XID that is the hardware's or the driver's fault marks its GPU unhealthy until
the agent restarts (after the GPU is reset or the node rebooted, which is what clears it on the
GPU too); the scheduler then gives that GPU no work and `orbit explain` says `gpu 1: xid 79`.
An XID the application caused (an illegal address, a kernel killed by a timeout) says nothing
about the GPU and is only logged."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("orbit.agent")

# Caused by the application, not the GPU (NVIDIA's XID catalog); the same list NVIDIA's
# Kubernetes device plugin skips by default: 13 graphics engine exception, 31 GPU memory page
# fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video processor exception,
# 109 context switch timeout.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
WAIT_MS = 500  # one wait on the event set: also how soon the thread sees that it must stop


class XidWatch:
    """The GPUs an XID has marked unhealthy, by index: {1: "xid 79"}. `on_fault` is called after
    each new one (the agent then tells the server at its next heartbeat)."""

    def __init__(self, on_fault: Callable[[], None] = lambda: None) -> None:
        self.on_fault = on_fault
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._faults: dict[int, str] = {}
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="agent-xids", daemon=True)
        self._thread.start()

    def close(self, timeout: float | None = None) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def faults(self) -> dict[int, str]:
        with self._lock:
            return dict(self._faults)

    def _run(self) -> None:
        try:
            import pynvml as nvml
        except ImportError:
            return
        try:
            nvml.nvmlInit()
        except Exception:  # no library, no driver: no GPUs to watch
            return
        events = None
        try:
            events = self._register(nvml)
            if events is not None:
                self._wait(nvml, events)
        except Exception:  # the watch is an extra: its failure must not take the agent down
            log.exception("XID watch stopped")
        finally:
            if events is not None:
                with contextlib.suppress(Exception):
                    nvml.nvmlEventSetFree(events)
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()

    def _register(self, nvml: Any) -> Any:
        """An event set with every GPU that takes XID events registered; None if none does."""
        try:
            events = nvml.nvmlEventSetCreate()
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            log.info("XID events not watched: %s", exc)
            return None
        watched = 0
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
                watched += 1
            except nvml.NVMLError as exc:
                log.info("XID events not watched on GPU %d: %s", index, exc)
        if not watched:
            nvml.nvmlEventSetFree(events)
            return None
        return events

    def _wait(self, nvml: Any, events: Any) -> None:
        timeout = getattr(nvml, "NVML_ERROR_TIMEOUT", 10)
        while not self.stop.is_set():
            try:
                event = nvml.nvmlEventSetWait(events, WAIT_MS)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) != timeout:  # not just "nothing happened"
                    log.warning("XID watch: %s", exc)
                    self.stop.wait(WAIT_MS / 1000)
                continue
            if not int(event.eventType) & int(nvml.nvmlEventTypeXidCriticalError):
                continue
            xid = int(event.eventData)
            try:
                index = int(nvml.nvmlDeviceGetIndex(event.device))
            except nvml.NVMLError:
                continue
            if xid in APPLICATION_XIDS:
                log.info(
                    "GPU %d: xid %d, caused by the application: the GPU stays in use", index, xid
                )
                continue
            with self._lock:
                changed = self._faults.get(index) != f"xid {xid}"
                self._faults[index] = f"xid {xid}"
            log.warning("GPU %d: xid %d: no new work on it until the agent restarts", index, xid)
            if changed:
                self.on_fault()
