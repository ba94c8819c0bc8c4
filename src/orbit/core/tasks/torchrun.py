"""`torchrun`: a script or a module on every GPU of the attempt, across one node or a gang.

The node runs orbit/runtime/torchrun_launch.py, staged into the bundle: it resolves
`nproc_per_node: auto` to the attempt's GPUs (known only there), starts torchrun with the
gang's rendezvous (ORBIT_NUM_NODES, ORBIT_MASTER_ADDR, ORBIT_MASTER_PORT, ORBIT_NODE_RANK)
bounded by join_timeout_s, keeps each rank's output apart and exits with the code of the rank
that failed first. Its settings travel in the job's env."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from orbit.core.tasks.command import stage_folder
from orbit.model.errors import InvalidInput
from orbit.model.models import ExecutionRequest, Resources, Text
from orbit.model.task import IMPORT_NAME, ShapedTask, StagedPath

LAUNCHER = Path(__file__).resolve().parents[2] / "runtime" / "torchrun_launch.py"
STAGED_AS = "orbit-torchrun/torchrun_launch.py"  # beside the workdir in inputs/, not in it


class Rendezvous(BaseModel):
    """How the nodes of a gang meet (one node needs none: torchrun --standalone). `static`
    ranks the nodes as the gang does (ORBIT_NODE_RANK); `c10d` in the order they join."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["static", "c10d"] = "static"
    conf: dict[str, str | int | float] = {}  # torchrun's --rdzv-conf


class TorchrunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    script: str | None = Field(default=None, min_length=1)
    # `python -m NAME` in every worker; the folder `workdir` (if any) is staged as the workdir
    module: str | None = Field(default=None, pattern=IMPORT_NAME, validate_default=True)
    workdir: str | None = None
    args: list[Text] = []
    nproc_per_node: Literal["auto"] | Annotated[int, Field(ge=1, le=1024)] = "auto"
    max_restarts: int = Field(default=0, ge=0, le=1000)
    rdzv: Rendezvous = Rendezvous()
    # a node that has not joined the gang's rendezvous by then fails the run
    join_timeout_s: float = Field(default=300.0, gt=0, le=86400)
    env: dict[str, Text] = {}
    interpreter: str = Field(default="python3", min_length=1)

    @field_validator("module")
    @classmethod
    def _one_target(cls, module: str | None, info: ValidationInfo) -> str | None:
        script = info.data.get("script")
        if (script is None) == (module is None) and "script" in info.data:
            raise ValueError(
                "give script (a file) or module (run as python -m NAME), one of the two"
            )
        return module

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, workdir: str | None, info: ValidationInfo) -> str | None:
        if workdir is not None and info.data.get("script") is not None:
            raise ValueError("a script's folder is its workdir: workdir goes with module")
        return workdir


class TorchrunTask:
    name: ClassVar[str] = "torchrun"
    request_model: ClassVar[type[BaseModel]] = TorchrunRequest

    def check_placement(self, request: TorchrunRequest, placement: ExecutionRequest) -> None:
        """More worker processes per node than each node will have GPUs: refused before
        freezing. Without GPUs the workers share the CPUs (gloo), as many as asked."""
        if request.nproc_per_node == "auto":
            return
        from orbit.scheduler.request_views import asks_of

        resources = placement.resources
        for field, ask in zip(_fields(resources), asks_of(resources), strict=True):
            if 0 < ask.gpu.count < request.nproc_per_node:
                raise InvalidInput(
                    f"task.nproc_per_node: {request.nproc_per_node} processes per node, but "
                    f"{field} gives each node {ask.gpu.count} GPU(s): one process per GPU at "
                    "most (or nproc_per_node: auto)"
                )

    def shape(self, request: TorchrunRequest, base_dir: Path) -> ShapedTask:
        staged = [StagedPath(source=LAUNCHER, dest=STAGED_AS)]
        if request.script is not None:
            script = (base_dir / request.script).resolve()
            if not script.is_file():
                raise InvalidInput(f"task.script: no such file: {script}")
            staged.append(StagedPath(source=script.parent, dest="workdir"))
            target = script.name
        else:
            if request.workdir is not None:
                staged.append(stage_folder(base_dir, "workdir", request.workdir))
            target = str(request.module)
        settings: dict[str, Any] = {
            "target": target,
            "module": request.module is not None,
            "args": list(request.args),
            "nproc_per_node": request.nproc_per_node,
            "max_restarts": request.max_restarts,
            "rdzv": request.rdzv.model_dump(),
            "join_timeout_s": request.join_timeout_s,
        }
        return ShapedTask(
            entrypoint=(request.interpreter, f"../{STAGED_AS}"),
            request=request.model_dump(),
            env={
                "PYTHONUNBUFFERED": "1",
                **request.env,
                "ORBIT_TORCHRUN": json.dumps(settings, sort_keys=True),
            },
            staged=tuple(staged),
            interpreter=request.interpreter,
        )


def _fields(resources: Resources) -> list[str]:
    if not resources.any_of:
        return ["resources"]
    return [f"resources.any_of[{n}]" for n in range(len(resources.any_of))]
