"""Named points where a test may have ORBIT's own process killed or held, to prove that what a
crash or a race leaves behind is reconciled. `ORBIT_FAILPOINTS=after-launch` kills the process
with SIGKILL right after the attempt started and before the store recorded it;
`before-launch=sleep:3` holds it there for 3 s; `after-submit=sleep:0.3` holds a submit once
its run is in the store, before it answers (a SIGKILL then loses the answer); `launch=skip`
leaves every new attempt prepared, never launched (bench/api.py measures submitting up to the
store with it). Unset, a point costs one lookup."""

from __future__ import annotations

import os
import signal
import time


def skips(name: str) -> bool:
    """Whether `name=skip` is set: the step is to be left out."""
    return f"{name}=skip" in os.environ.get("ORBIT_FAILPOINTS", "").split(",")


def hit(name: str) -> None:
    for point in os.environ.get("ORBIT_FAILPOINTS", "").split(","):
        found, _, action = point.partition("=")
        if found != name:
            continue
        if action.startswith("sleep:"):
            time.sleep(float(action.removeprefix("sleep:")))
        else:
            os.kill(os.getpid(), signal.SIGKILL)
