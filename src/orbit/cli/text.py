"""Plain terminal output: aligned tables and a little colour, with the standard library only.

The commands people run hundreds of times a day (`runs list`, `status`) must answer at once, and
loading Rich costs more than the rest of such a command. Tables here never wrap or cut a cell:
columns are as wide as their widest cell, and a long last column runs on as the terminal wraps
it, whole words and all. Colour only on a terminal, and never with NO_COLOR set."""

from __future__ import annotations

import os
import re
import sys
from typing import Any, TextIO

STYLES = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "cyan": "36",
    "bold red": "1;31",
}
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def colour(stream: TextIO) -> bool:
    return stream.isatty() and "NO_COLOR" not in os.environ


def paint(text: str, style: str | None, stream: TextIO | None = None) -> str:
    """`text` in `style` (see STYLES) where `stream` (stdout by default) shows colour."""
    if not style or not colour(stream or sys.stdout):
        return text
    return f"\x1b[{STYLES[style]}m{text}\x1b[0m"


def width(text: str) -> int:
    return len(ANSI.sub("", text))


class Table:
    def __init__(self, *columns: str, title: str | None = None) -> None:
        self.columns = columns
        self.title = title
        self.rows: list[tuple[str, ...]] = []

    def add_row(self, *cells: str) -> None:
        self.rows.append(tuple(cells))

    def lines(self, stream: TextIO | None = None) -> list[str]:
        header = tuple(paint(c, "bold", stream) for c in self.columns)
        rows = [header, *self.rows]
        widths = [max(width(row[i]) for row in rows) for i in range(len(self.columns))]
        out = [self.title] if self.title else []
        for row in rows:
            cells = [cell + " " * (widths[i] - width(cell)) for i, cell in enumerate(row)]
            out.append("  ".join(cells).rstrip())
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


class Printer:
    """What the commands print with: `print(text_or_table, style=...)`."""

    def __init__(self, stream: str = "stdout") -> None:
        self._stream = stream

    @property
    def stream(self) -> TextIO:
        found: TextIO = getattr(sys, self._stream)
        return found

    def print(self, *objects: Any, style: str | None = None) -> None:
        stream = self.stream
        for obj in objects:
            lines = obj.lines(stream) if isinstance(obj, Table) else [str(obj)]
            for line in lines:
                stream.write(paint(line, style, stream) + "\n")
        stream.flush()
