"""What every CLI module shares: the consoles, the lazily built service, common options."""

from __future__ import annotations

from functools import cache
from typing import Any

import typer
from rich.console import Console

from orbit.core.config import Settings
from orbit.core.control.service import CoreControlService
from orbit.core.execution.sources import read_provenance

console = Console(highlight=False)
err = Console(stderr=True, highlight=False)

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
    return Settings.from_env()


@cache
def service() -> CoreControlService:
    return CoreControlService.from_settings(settings())


def bundles_dir() -> str:
    return str(settings().bundles_dir)


def provenance(digest: str) -> dict[str, Any] | None:
    """The bundle's provenance.json (git commits, dirty or not), from the local bundle cache."""
    return read_provenance(settings().bundles_dir / digest)
