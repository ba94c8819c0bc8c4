"""What every CLI module shares: the printers, the control plane as a client sees it, and the
common options. Everything heavy is loaded on first use, so `orbit --help` stays quick."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

import typer

from orbit.cli.complete import complete_runs
from orbit.cli.text import Printer

if TYPE_CHECKING:
    from orbit.core.control.api import ControlAPI
    from orbit.model.config import Settings


console = Printer("stdout")
err = Printer("stderr")

JSON = typer.Option(False, "--json", help="Print machine-readable JSON only.")
FORMATS = ("json", "yaml", "wide", "name")
OUTPUT = typer.Option(
    None,
    "--output",
    "-o",
    metavar="FORMAT",
    help="json | yaml (the same data as --json) | wide (the table, with more columns where "
    "there are more) | name (one id or name a line, for xargs).",
)


RUN = typer.Argument(
    ...,
    metavar="RUN",
    help="A run id, or any unique prefix of one.",
    autocompletion=complete_runs,
)
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
    """The control plane this CLI talks to, through its one client interface; a server's
    transfers draw bars where standard error is a terminal (orbit.cli.progress)."""
    from orbit.cli.progress import terminal_meter
    from orbit.client.connect import connect

    return connect(settings(), terminal_meter())


def print_json(data: Any) -> None:
    import json

    print(json.dumps(data, indent=2, sort_keys=False, default=str))


def output_format(as_json: bool, output: str | None) -> str:
    """What a listing prints: -o's format (kubectl's), json for --json, else its table."""
    if output is None:
        return "json" if as_json else "table"
    if output not in FORMATS:
        from orbit.model.errors import InvalidInput

        raise InvalidInput(f"-o {output}: unknown format (expected one of: {', '.join(FORMATS)})")
    return output


def emitted(fmt: str, rows: Callable[[], list[dict[str, Any]]], name: str = "id") -> bool:
    """Print a listing's `rows` as json, yaml or names, and say so; False for a table (the
    caller's to print, wide or not)."""
    if fmt == "json":
        print_json(rows())
    elif fmt == "yaml":
        import json

        import yaml

        # through JSON first: the same values as -o json (times as text, enums as values)
        data = json.loads(json.dumps(rows(), default=str))
        print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")
    elif fmt == "name":
        for row in rows():
            print(row[name])
    else:
        return False
    return True
