"""What every CLI module shares: the printers, the control plane as a client sees it, and the
common options. Everything heavy is loaded on first use, so `orbit --help` stays quick."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

import typer

from orbit.cli.text import Printer

if TYPE_CHECKING:
    from orbit.core.control.api import ControlAPI
    from orbit.model.config import Settings


console = Printer("stdout")
err = Printer("stderr")

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
    from orbit.model.config import Settings

    return Settings.from_env()


@cache
def service() -> ControlAPI:
    """The control plane this CLI talks to, through its one client interface."""
    from orbit.client.connect import connect

    return connect(settings())


def print_json(data: Any) -> None:
    import json

    print(json.dumps(data, indent=2, sort_keys=False, default=str))
