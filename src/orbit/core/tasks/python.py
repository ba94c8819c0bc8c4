"""`python`: a script and its arguments; the script's folder is staged as the workdir."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from orbit.model.errors import InvalidInput
from orbit.model.models import Text
from orbit.model.task import ShapedTask, StagedPath


class PythonRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    script: str = Field(min_length=1)
    args: list[Text] = []
    env: dict[str, Text] = {}
    interpreter: str = Field(default="python3", min_length=1)


class PythonTask:
    name: ClassVar[str] = "python"
    request_model: ClassVar[type[BaseModel]] = PythonRequest

    def shape(self, request: PythonRequest, base_dir: Path) -> ShapedTask:
        script = (base_dir / request.script).resolve()
        if not script.is_file():
            raise InvalidInput(f"task.script: no such file: {script}")
        env = {"PYTHONUNBUFFERED": "1", **request.env}
        return ShapedTask(
            entrypoint=(request.interpreter, script.name, *request.args),
            request=request.model_dump(),
            env=env,
            staged=(StagedPath(source=script.parent, dest="workdir"),),
            interpreter=request.interpreter,
        )
