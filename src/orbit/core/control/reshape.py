"""What is recorded is what runs, through `orbit server` too: the client shapes the task where its
files are and sends the shaped task (ShapedWire) beside the inputs it gathered, and the server
shapes the submitted task_request again with its own copy of the same plugin, over those inputs
seen at the client's paths (orbit.core.tasks.client_files). What it freezes is its own shaping;
where the client's says otherwise (another entrypoint, env, interpreter...), the submission is
refused naming the field, since the client then sent something its task_request does not give.

The plugin's own files that a shaping stages (a launcher script shipped with it) are the
server's copies, whatever the client sent in their place. The client's files (a script, a
workdir, a batch) are frozen as sent: they are the submission's, and the digest covers them."""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, ValidationError, field_validator, model_validator

from orbit.model.env_check import ENV_NAME
from orbit.model.errors import InvalidInput, describe_validation_error
from orbit.model.models import Strict, Text
from orbit.model.task import IMPORT_NAME, ShapedTask, StagedPath, TaskPlugin

if TYPE_CHECKING:
    from orbit.core.execution.bundle import Memo
    from orbit.core.tasks import TaskRegistry
    from orbit.model.models import TaskSubmission

ImportName = Annotated[str, Field(pattern=IMPORT_NAME, max_length=256)]
ClientPathText = Annotated[str, Field(min_length=1, max_length=4096)]
# what the server's shaping must give as the client's did (staged: by dest, see _check_staged)
COMPARED = (
    "entrypoint",
    "request",
    "env",
    "workdir",
    "interpreter",
    "shell_command",
    "critical_imports",
    "optional_imports",
)
SHOWN = 160  # characters of the server's value a mismatch shows


def _inside_inputs(value: str) -> str:
    clean = posixpath.normpath(value)
    if value.startswith("/") or clean != value or clean == ".." or clean.startswith("../"):
        raise ValueError("must be a plain relative path inside inputs/ (no '..', no '/')")
    return value


def _client_path(value: str) -> str:
    if "\x00" in value or not value.startswith("/") or posixpath.normpath(value) != value:
        raise ValueError(f"{value!r}: must be an absolute, normalized path of the client")
    return value


class StagedWire(Strict):
    """One part of the inputs: the client's path it came from and where it is under inputs/."""

    source: ClientPathText
    dest: str = Field(min_length=1, max_length=1024)

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        return _client_path(value)

    @field_validator("dest")
    @classmethod
    def _dest(cls, value: str) -> str:
        return _inside_inputs(value)


class LinkWire(Strict):
    """A path of the request that leads through a symlink on the client, and where to."""

    path: ClientPathText
    target: ClientPathText

    @field_validator("path", "target")
    @classmethod
    def _paths(cls, value: str) -> str:
        return _client_path(value)


class ShapedWire(Strict):
    """A shaped task as a client sends it to `orbit server`, beside its gathered inputs, with
    what the server needs to shape it again: the client's base folder, where each part of the
    inputs came from, and the request's paths that lead through symlinks."""

    entrypoint: tuple[Text, ...] = Field(min_length=1)
    request: dict[str, Any]
    env: dict[str, Text] = {}
    workdir: str = Field(default="workdir", min_length=1, max_length=256)
    interpreter: str = Field(default="python3", min_length=1, max_length=4096)
    shell_command: str | None = None
    critical_imports: tuple[ImportName, ...] = ()
    optional_imports: tuple[ImportName, ...] = ()
    base_dir: ClientPathText
    staged: tuple[StagedWire, ...] = Field(default=(), max_length=256)
    links: tuple[LinkWire, ...] = Field(default=(), max_length=64)

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str) -> str:
        return _inside_inputs(value)

    @field_validator("base_dir")
    @classmethod
    def _base(cls, value: str) -> str:
        return _client_path(value)

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not an environment variable name")
        return value

    @model_validator(mode="after")
    def _no_nul(self) -> ShapedWire:
        texts = [*self.entrypoint, *self.env.values(), self.interpreter, self.shell_command or ""]
        if any("\x00" in text for text in texts):
            raise ValueError("a NUL byte cannot be passed to a process")
        return self

    @classmethod
    def of(
        cls, shaped: ShapedTask, base_dir: Path, links: list[tuple[str, str]] | None = None
    ) -> ShapedWire:
        """Everything of a shaped task but the files it stages (they travel beside it)."""
        own = {name: getattr(shaped, name) for name in COMPARED}
        staged = [StagedWire(source=_absolute(s.source), dest=s.dest) for s in shaped.staged]
        found = [LinkWire(path=p, target=t) for p, t in links or ()]
        return cls(**own, base_dir=_absolute(base_dir), staged=staged, links=found)


def _absolute(path: Path) -> str:
    """The path as its text says it, made absolute where it is not (never through os.fspath:
    a ClientPath's disk is the mirror's)."""
    text = str(path)
    return posixpath.normpath(text) if text.startswith("/") else os.path.abspath(text)


def shape_sent(
    tasks: TaskRegistry,
    submission: TaskSubmission,
    wire: ShapedWire,
    inputs: Path,
    source: str,
    memo: Memo | None = None,
) -> ShapedTask:
    """The task shaped here from the submitted task_request, over the inputs the client sent;
    refused where the client's shaping (`wire`) says otherwise. Its own files restaged, and
    the client's files they replace forgotten by `memo` (hashes by inode, which a new file
    may take again)."""
    from orbit.core.tasks.client_files import ClientPath, client_base

    staged = [(s.source, s.dest) for s in wire.staged]
    links = [(link.path, link.target) for link in wire.links]
    with client_base(inputs, wire.base_dir, staged, links) as base:
        shaped = tasks.shape(submission.task_type, submission.task_request, base, source)
        _check_same(shaped, wire, submission.task_type, source)
        plugin = tasks.plugin(submission.task_type)
        own = [s for s in shaped.staged if not isinstance(s.source, ClientPath)]
    _restage(inputs, [s for s in own if _ships_with(plugin, s.source)], memo)
    return dataclasses.replace(shaped, staged=())


def shape_points(
    tasks: TaskRegistry,
    points: list[TaskSubmission],
    wire: ShapedWire,
    inputs: Path,
    source: str,
    memo: Memo | None = None,
) -> list[ShapedTask]:
    """shape_sent for a sweep's submissions, one per point, over the one set of inputs the
    client gathered shaping the first (`wire`, checked against that one). A point that would
    stage other files than the first is refused: a sweep fills arguments, not files."""
    from orbit.core.tasks.client_files import client_base

    first = shape_sent(tasks, points[0], wire, inputs, source, memo)
    staged = [(s.source, s.dest) for s in wire.staged]
    links = [(link.path, link.target) for link in wire.links]
    dests = sorted(s.dest for s in wire.staged)
    shaped = [first]
    with client_base(inputs, wire.base_dir, staged, links) as base:
        for point in points[1:]:
            mine = tasks.shape(point.task_type, point.task_request, base, source)
            if sorted(s.dest for s in mine.staged) != dests:
                raise InvalidInput(
                    f"{source}: sweep point {point.point}: the task stages other files than "
                    "the first point's; a sweep fills arguments and env, not files"
                )
            shaped.append(dataclasses.replace(mine, staged=()))
    return shaped


def _check_same(shaped: ShapedTask, wire: ShapedWire, task_type: str, source: str) -> None:
    """Each field as the wire carries it (validated as the client's was; as JSON, where a
    tuple is a list), and the staged parts by where they go."""
    try:
        mine = ShapedWire.of(shaped, Path(wire.base_dir)).model_dump(mode="json")
    except ValidationError as exc:  # what a client's shaping could not have sent either
        line = describe_validation_error(source, exc)
        raise InvalidInput(line.replace(f"{source}: ", f"{source}: shaped.", 1)) from None
    sent = wire.model_dump(mode="json")
    for name in COMPARED:
        if mine[name] != sent[name]:
            _mismatch(source, name, task_type, mine[name])
    dests = sorted(s["dest"] for s in mine["staged"])
    if dests != sorted(s["dest"] for s in sent["staged"]):
        _mismatch(source, "staged", task_type, dests)


def _mismatch(source: str, name: str, task_type: str, value: Any) -> None:
    shown = json.dumps(value, ensure_ascii=True)
    shown = shown if len(shown) <= SHOWN else shown[: SHOWN - 3] + "..."
    raise InvalidInput(
        f"{source}: shaped.{name}: does not match what task_request gives (task type "
        f"'{task_type}' shapes it as {shown}); what the client froze would not be what the "
        "run's record shows"
    )


def _ships_with(plugin: TaskPlugin, path: Path) -> bool:
    """Whether `path` is part of the plugin's own package (its module, if it is no package) or
    of ORBIT's: only such files are taken from the server's disk. Anything else a plugin
    stages without base_dir is left as the client sent it."""
    real = Path(os.path.realpath(path))
    return any(
        real == root or real.is_relative_to(root)
        for root in (_package_of(type(plugin).__module__), _package_of(__name__))
        if root is not None
    )


def _package_of(module_name: str) -> Path | None:
    module = sys.modules.get(module_name.partition(".")[0])
    where = getattr(module, "__file__", None)
    if where is None:
        return None
    root = Path(where).resolve()
    return root.parent if hasattr(module, "__path__") else root


def _restage(inputs: Path, own: list[StagedPath], memo: Memo | None) -> None:
    """Put the server's copies of the plugin's own files where the client put its copies."""
    from orbit.core.execution.bundle import forget, stage_inputs

    for item in own:
        dest = inputs / item.dest
        forget(memo, dest)
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        elif dest.is_symlink() or dest.exists():
            dest.unlink()
    stage_inputs(inputs, own)
