"""Named points where a test may have ORBIT's own process killed, to prove that what a crash
leaves behind is reconciled: `ORBIT_FAILPOINTS=after-launch` kills the process with SIGKILL
right after the attempt started and before the store recorded it. Unset, it costs one lookup."""

from __future__ import annotations

import os
import signal


def hit(name: str) -> None:
    if name in os.environ.get("ORBIT_FAILPOINTS", "").split(","):
        os.kill(os.getpid(), signal.SIGKILL)
