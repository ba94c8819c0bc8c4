"""The seam every task type implements."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field

IMPORT_NAME = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


@dataclass(frozen=True)
class StagedPath:
    """A file or folder on the control plane to copy into the bundle's inputs/ at `dest`."""

    source: Path
    dest: str


@dataclass(frozen=True)
class Upstream:
    """A git source the task type itself stages (an integration's pinned upstream): as a
    `task.sources` entry is, at `path` under inputs/, but never with --allow-dirty: an upstream
    runs exactly as committed. `field` names it in errors (task.upstream)."""

    repo: str  # a checkout: absolute, or relative to the spec
    commit: str
    path: str
    field: str


@dataclass(frozen=True)
class ShapedTask:
    """A validated request, shaped: what to run, where inside inputs/, and what to stage."""

    entrypoint: tuple[str, ...]
    request: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "workdir"
    staged: tuple[StagedPath, ...] = ()
    interpreter: str = "python3"  # the python the task runs with: the precheck runs in it
    # a command in shell form: the launch mode picks its shell (orbit.model.launch_modes
    # .task_entrypoint); `entrypoint` is then its host-process form, `bash -c COMMAND`
    shell_command: str | None = None
    # the precheck gates the task on these (beside the request's own critical_imports), and
    # records the optional ones, saying once which are absent
    critical_imports: tuple[str, ...] = ()
    optional_imports: tuple[str, ...] = ()
    upstreams: tuple[Upstream, ...] = ()
    # what the task type checks of inputs/ once its upstreams are there (an environment the
    # pinned tree must have): raises InvalidInput naming the field
    check_inputs: Callable[[Path], None] | None = None


class CommonTaskFields(BaseModel):
    """Fields every task type accepts, handled by ORBIT rather than by the plugin."""

    model_config = ConfigDict(extra="forbid")

    critical_imports: list[str] = Field(
        default=[],
        description="import names the precheck must find in the task's interpreter",
    )
    sources: list[dict[str, Any]] = Field(
        default=[], description="git sources pinned to a commit: {repo, ref, path}"
    )


COMMON_KEYS = frozenset(CommonTaskFields.model_fields)


class TaskPlugin(Protocol):
    """Third parties register theirs under the `orbit.tasks` entry-point group."""

    name: ClassVar[str]
    request_model: ClassVar[type[BaseModel]]

    def shape(self, request: Any, base_dir: Path) -> ShapedTask:
        """Turn a validated request into a job. Relative paths are relative to `base_dir`.

        Reach the request's files through `base_dir` (`base_dir / request.file`, absolute
        paths too): through `orbit server` the server shapes the request again, and `base_dir`
        is then the client's folder as the files it sent show it
        (orbit.core.tasks.client_files). Files of the plugin's own package may be staged as
        they are: the server stages its own copies.

        Raise orbit.model.errors.InvalidInput naming the field for anything the model cannot check
        (a file that is missing, say).
        """
        ...
