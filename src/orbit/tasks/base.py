"""The seam every task type implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel


@dataclass(frozen=True)
class StagedPath:
    """A file or folder on the control plane to copy into the bundle's inputs/ at `dest`."""

    source: Path
    dest: str


@dataclass(frozen=True)
class ShapedTask:
    """A validated request, shaped: what to run, where inside inputs/, and what to stage."""

    entrypoint: tuple[str, ...]
    request: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "workdir"
    staged: tuple[StagedPath, ...] = ()


class TaskPlugin(Protocol):
    """Third parties register theirs under the `orbit.tasks` entry-point group."""

    name: ClassVar[str]
    request_model: ClassVar[type[BaseModel]]

    def shape(self, request: Any, base_dir: Path) -> ShapedTask:
        """Turn a validated request into a job. Relative paths are relative to `base_dir`.

        Raise orbit.errors.InvalidInput naming the field for anything the model cannot check
        (a file that is missing, say).
        """
        ...
