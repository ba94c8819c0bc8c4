"""A signal inside one process: the part that makes something happen tells the parts that wait
for it, without knowing them. A command queued for a node wakes the server's long-poll of that
node at once; a run that may now be placed asks the server's scheduler loop for a pass. Each
signal is made with the control plane and handed to its parts at construction: no list of
listeners lives in a module, so two control planes in one process hear only their own."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, ParamSpec

P = ParamSpec("P")


class Signal(Generic[P]):
    def __init__(self) -> None:
        self._listeners: list[Callable[P, None]] = []
        self._lock = threading.Lock()

    def listen(self, listener: Callable[P, None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def forget(self, listener: Callable[P, None]) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    @property
    def heard(self) -> bool:
        """Whether anyone listens (else the one who sends may do the work itself)."""
        with self._lock:
            return bool(self._listeners)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Thread-safe; each listener is called in the sender's thread."""
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(*args, **kwargs)
