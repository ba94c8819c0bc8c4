r"""Plain terminal output: aligned tables and a little colour, with the standard library only.

The commands people run hundreds of times a day (`runs list`, `status`) must answer at once, and
loading Rich costs more than the rest of such a command. Tables here never wrap or cut a cell:
columns are as wide as their widest cell, and a long last column runs on as the terminal wraps
it, whole words and all. Colour only on a terminal, and never with NO_COLOR set.

What others wrote (names, commands, env, log lines, a server's error) reaches the terminal only
as text: every cell of a Table and every line a Printer writes goes through `shown`, which
writes control characters and escape sequences out as escapes (`\x1b[2J`, `\r`, `\n`). So a
tenant's token name cannot clear an admin's screen, move the cursor or start a second table
row. JSON output does not come here: json.dumps escapes them itself."""

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
# The sequences paint() writes pass `shown` as they are; a tenant who types one gets at most a
# colour of this list (no cursor move, no clearing, no hiding), never a line of its own.
_OURS = "|".join(re.escape(f"\x1b[{code}m") for code in (*STYLES.values(), "0"))
# C0 and C1 controls, DEL, and the bidirectional and line-separator marks that reorder or
# break a line as displayed
_UNSAFE = re.compile(
    f"({_OURS})|[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def shown(text: str) -> str:
    r"""`text` as one line a terminal shows as written: each control character (ESC, CR, LF,
    tab...) spelled as its escape (`\x1b`, `\r`, `\n`, `\t`, `\u202e`); what paint() wrote
    kept."""
    return _UNSAFE.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    if match.group(1):
        return match.group(1)
    char = match.group(0)
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


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
        self.rows.append(tuple(shown(cell) for cell in cells))

    def lines(self, stream: TextIO | None = None) -> list[str]:
        header = tuple(paint(shown(c), "bold", stream) for c in self.columns)
        rows = [header, *self.rows]
        widths = [max(width(row[i]) for row in rows) for i in range(len(self.columns))]
        out = [shown(self.title)] if self.title else []
        for row in rows:
            cells = [cell + " " * (widths[i] - width(cell)) for i, cell in enumerate(row)]
            out.append("  ".join(cells).rstrip())
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


class Printer:
    r"""What the commands print with: `print(text_or_table, style=...)`. A text is one line:
    a newline in it is shown as `\n` (print several lines as several texts, or a Table)."""

    def __init__(self, stream: str = "stdout") -> None:
        self._stream = stream

    @property
    def stream(self) -> TextIO:
        found: TextIO = getattr(sys, self._stream)
        return found

    def print(self, *objects: Any, style: str | None = None) -> None:
        stream = self.stream
        for obj in objects:
            lines = obj.lines(stream) if isinstance(obj, Table) else [shown(str(obj))]
            for line in lines:
                stream.write(paint(line, style, stream) + "\n")
        stream.flush()
