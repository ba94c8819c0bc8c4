"""`--watch` (`-w`) on listings and `status`: show the same view again every `--interval`
seconds. On a terminal each view replaces the last (the screen cleared and redrawn in place);
on a pipe or a file each view that changed is appended after a blank line and nothing else is
written: no control sequence ever reaches a file. Ctrl-C ends it quietly (exit 0)."""

from __future__ import annotations

import contextlib
import io
import sys
import time
from collections.abc import Callable

import typer

WATCH = typer.Option(
    False, "--watch", "-w", help="Show it again every --interval seconds until Ctrl-C."
)
INTERVAL = typer.Option(
    2.0, "--interval", min=0.2, max=3600.0, metavar="SECONDS", help="With --watch: how often."
)
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen


def repeat(draw: Callable[[], bool], watch: bool, interval: float) -> None:
    """`draw()` prints one view and says whether there is nothing more to watch (a run that
    ended); once without --watch."""
    if not watch:
        draw()
        return
    out, err = sys.stdout, sys.stderr
    terminal = out.isatty()
    shown: tuple[str, str] | None = None
    try:
        while True:
            view, said = io.StringIO(), io.StringIO()  # stdout's part, stderr's ("no runs")
            with contextlib.redirect_stdout(view), contextlib.redirect_stderr(said):
                done = draw()
            now = (view.getvalue(), said.getvalue())
            if terminal:
                out.write(CLEAR + now[0] + now[1])
            elif now != shown:
                out.write(("\n" if shown is not None else "") + now[0])
                err.write(now[1])
            out.flush()
            err.flush()
            shown = now
            if done:
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        return
