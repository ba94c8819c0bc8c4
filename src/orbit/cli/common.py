"""What every CLI module shares: the consoles, the control plane as a client sees it, and the
common options. Everything heavy is loaded on first use, so `orbit --help` stays quick."""

from __future__ import annotations

import sys
from functools import cache
from typing import TYPE_CHECKING, Any, cast

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from orbit.core.config import Settings
    from orbit.core.control.api import ControlAPI


class LazyConsole:
    """A rich Console made on first use. Piped output is never wrapped (a table or a YAML file
    read by a program must not be cut at 80 columns)."""

    def __init__(self, stderr: bool = False) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            stream = sys.stderr if self._stderr else sys.stdout
            wide = None if stream.isatty() else 100_000
            self._console = Console(stderr=self._stderr, highlight=False, width=wide)
        return getattr(self._console, name)


console = cast("Console", LazyConsole())
err = cast("Console", LazyConsole(stderr=True))

JSON = typer.Option(False, "--json", help="Print machine-readable JSON only.")
RUN = typer.Argument(..., metavar="RUN", help="A run id, or any unique prefix of one.")
ATTEMPT = typer.Option(
    None, "--attempt", "-a", min=1, help="An earlier attempt (default: the current one)."
)
SETS = typer.Option(
    [],
    "--set",
    metavar="KEY=VALUE",
    help="Override a template field, e.g. --set resources.gpu_count=2 (repeatable).",
)


@cache
def settings() -> Settings:
    from orbit.core.config import Settings

    return Settings.from_env()


@cache
def service() -> ControlAPI:
    """The control plane this CLI talks to, through its one client interface."""
    from orbit.core.control import connect

    return connect(settings())


def print_json(data: Any) -> None:
    import json

    print(json.dumps(data, indent=2, sort_keys=False, default=str))
