"""Transfer bars: a submission's inputs going up, a collect, `orbit nodes push` and `pull`
drawn with bytes, rate and time left on standard error, where that is a terminal. A pipe or a
file gets none of it (no bar, no control sequence), and neither does a terminal with
ORBIT_NO_PROGRESS set (`--no-progress`) or TERM=dumb. Rich (which Typer brings) is loaded
only once a bar is drawn, so a command that moves nothing never pays for it."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from orbit.client.meter import Meter, Tick


def terminal_meter() -> Meter | None:
    """Bars on standard error where it is a terminal and nothing said not to; else None."""
    quiet = os.environ.get("ORBIT_NO_PROGRESS", "") not in ("", "0")
    if quiet or os.environ.get("TERM") == "dumb" or not sys.stderr.isatty():
        return None
    return Bars()


class Bars:
    """A Meter that draws one bar per transfer, left in place once it ends (what moved)."""

    @contextlib.contextmanager
    def track(self, what: str, total: int | None) -> Iterator[Tick]:
        if total == 0:  # nothing to move: no bar
            yield lambda moved: None
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=Console(file=sys.stderr),
        )
        with bar:
            task = bar.add_task(what, total=total)
            yield lambda moved: bar.update(task, completed=moved)
