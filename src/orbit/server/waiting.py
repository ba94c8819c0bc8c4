"""Long waits inside a request, kept off the worker threads that every quick request shares
(anyio's default pool: 40 threads). A cancel's wait for its run to end sleeps in the event loop
and looks at the run now and then on a few threads of its own; work that can block for long
where it runs (collecting from a node, a transfer, checking a host or a cluster) runs on a
bounded pool of its own. However many such requests are open, /healthz and everyone's quick
requests find a free thread."""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from anyio import CapacityLimiter

from orbit.core.control.service import CoreControlService
from orbit.model.records import RunRecord

T = TypeVar("T")

SLOW_THREADS = 16  # requests that may block for long, at once (the rest queue behind them)
LOOK_THREADS = 4  # looks at waited-for runs, at once
LOOK_EVERY_S = 0.5  # how often a waiting cancel looks at its run

# made once per process: anyio's limiters are not tied to an event loop until first used
SLOW = CapacityLimiter(SLOW_THREADS)
LOOKS = CapacityLimiter(LOOK_THREADS)


async def slow(call: Callable[[], T]) -> T:
    """Run `call` (which may block for long) on the slow requests' threads."""
    return await anyio.to_thread.run_sync(call, limiter=SLOW)


def on_slow_threads(route: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """A route (a plain function) that FastAPI calls on the slow requests' threads rather
    than on the quick ones'. Its signature is the route's: FastAPI reads its parameters
    through the wrapper."""

    @functools.wraps(route)
    async def on_slow(*args: Any, **kwargs: Any) -> T:
        return await slow(functools.partial(route, *args, **kwargs))

    return on_slow


async def until_ended(service: CoreControlService, ref: str, wait_s: float) -> RunRecord:
    """The run once it ended, or as it stands after `wait_s` seconds: what
    CoreControlService.wait_for answers, without a thread held between looks."""
    deadline = time.monotonic() + wait_s
    while True:
        run = await anyio.to_thread.run_sync(service.refresh_run_status, ref, limiter=LOOKS)
        left = deadline - time.monotonic()
        if run.state.terminal or left <= 0:
            return run
        await anyio.sleep(min(LOOK_EVERY_S, left))
