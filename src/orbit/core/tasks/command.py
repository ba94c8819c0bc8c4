"""`command`: a shell command or an argv list, with env and an optional workdir to stage."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from orbit.model.errors import InvalidInput
from orbit.model.models import Text
from orbit.model.task import ShapedTask, StagedPath


class CommandRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str | list[Text] = Field(min_length=1)
    env: dict[str, Text] = {}
    workdir: str | None = None


def stage_folder(base_dir: Path, field: str, value: str) -> StagedPath:
    folder = (base_dir / value).resolve()
    if not folder.is_dir():
        raise InvalidInput(f"task.{field}: no such folder: {folder}")
    return StagedPath(source=folder, dest="workdir")


class CommandTask:
    name: ClassVar[str] = "command"
    request_model: ClassVar[type[BaseModel]] = CommandRequest

    def shape(self, request: CommandRequest, base_dir: Path) -> ShapedTask:
        shell = request.command if isinstance(request.command, str) else None
        entrypoint = ("bash", "-c", shell) if shell is not None else tuple(request.command)
        staged = (
            () if request.workdir is None else (stage_folder(base_dir, "workdir", request.workdir),)
        )
        return ShapedTask(
            entrypoint=entrypoint,
            request=request.model_dump(),
            env=dict(request.env),
            staged=staged,
            shell_command=shell,
        )
