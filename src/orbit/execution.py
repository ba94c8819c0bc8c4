"""The execution service: routes each request to the backend for its key."""

from __future__ import annotations

from collections.abc import Iterable

from orbit.backends.base import ExecutionBackend
from orbit.config import Settings
from orbit.errors import NoBackend


class ExecutionService:
    def __init__(self, backends: Iterable[ExecutionBackend]) -> None:
        self._backends = {b.key: b for b in backends}

    def keys(self) -> list[str]:
        return sorted(self._backends)

    def backend(self, key: str) -> ExecutionBackend:
        try:
            return self._backends[key]
        except KeyError:
            known = ", ".join(self.keys())
            raise NoBackend(f"no backend for {key} yet (available: {known})") from None

    @classmethod
    def default(cls, settings: Settings) -> ExecutionService:
        from orbit.backends.local_host_process import LocalHostProcessBackend

        return cls([LocalHostProcessBackend(settings.work_dir)])
