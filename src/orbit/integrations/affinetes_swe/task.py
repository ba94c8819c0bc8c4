"""`task_type: affinetes`: an environment of the upstream affinetes repository (its
`environments/NAME/env.py`, whose actor's async `evaluate()` scores a model behind an
OpenAI-compatible endpoint), run as it is at an exact commit.

The upstream is staged at inputs/upstream from a checkout at that commit, byte for byte and
never with local changes (orbit.model.task.Upstream); the environment and its actor are checked
against that staged copy before anything is frozen. On the node, launch.py (staged into the
workdir, standard library only) checks the staged tree against the commit's tree id, imports
env.py, awaits evaluate() per task and writes upstream's results unmodified, the progress and
the thin manifest (see launch.py)."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orbit.core.tasks.http import on_the_node
from orbit.model.errors import InvalidInput
from orbit.model.nodes import SERVICE_LABEL
from orbit.model.task import ShapedTask, StagedPath, Upstream

HERE = Path(__file__).resolve().parent
LAUNCHER = HERE / "launch.py"
BRIDGE = HERE / "bridge.py"
PYENV = HERE / "pyenv.py"
EVALUATING = HERE / "evaluating.py"
GIT_TREE = HERE.parents[1] / "runtime" / "git_tree.py"
UPSTREAM_DIR = "upstream"  # under inputs/
MAX_TASKS = 100_000
SEGMENT = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"
NAME = rf"^{SEGMENT}(/{SEGMENT})?$"  # environments/NAME or environments/GROUP/NAME
IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"


class UpstreamSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    repo: str = Field(
        min_length=1,
        description="a git checkout (absolute, or relative to the spec) or a URL to mirror",
    )
    commit: str = Field(description="the exact 40-character commit")

    @field_validator("commit")
    @classmethod
    def _commit(cls, value: str) -> str:
        if len(value) != 40 or any(c not in "0123456789abcdefABCDEF" for c in value):
            raise ValueError(f"expected the exact 40-character commit hash, got {value!r}")
        return value.lower()


class TaskRange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    range: tuple[int, int] = Field(description="[first, end): the task ids first .. end - 1")

    @field_validator("range")
    @classmethod
    def _range(cls, value: tuple[int, int]) -> tuple[int, int]:
        first, end = value
        if not 0 <= first < end or end - first > MAX_TASKS:
            raise ValueError(f"expected [first, end) with 0 <= first < end, at most {MAX_TASKS}")
        return value


class Endpoint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # a model server the node advertises (orbit agent --service NAME=URL): placed where it is
    service: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    base_url: str | None = Field(default=None, description="the node's own server: loopback")
    path: str = Field(default="/v1", pattern=r"^/", description="under the service's URL")

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str | None) -> str | None:
        return None if value is None else on_the_node(value, "http://HOST:PORT/v1")

    @model_validator(mode="after")
    def _one(self) -> Endpoint:
        if (self.service is None) == (self.base_url is None):
            raise ValueError("give service (one the node advertises) or base_url, one of the two")
        return self


class AffinetesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    upstream: UpstreamSpec
    environment: str = Field(pattern=NAME, description="under environments/: NAME or GROUP/NAME")
    actor: str | None = Field(
        default=None, pattern=IDENTIFIER, description="default: Actor, else the one there is"
    )
    tasks: list[int | str] | TaskRange | None = Field(
        default=None, description="task ids, or {range: [first, end]} (evaluate)"
    )
    model: str = Field(min_length=1, max_length=512)
    endpoint: Endpoint
    # the name of an env var on the node holding the endpoint's API key (never frozen)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    concurrency: int = Field(default=4, ge=1, le=256)
    timeout_s: float = Field(default=1800.0, gt=0, le=7 * 86400, description="per task")
    evaluate_args: dict[str, Any] = Field(default={}, description="to evaluate() unchanged")
    actor_args: dict[str, Any] = Field(default={}, description="to the actor's constructor")
    # evaluate: evaluate() per task; bridge: the actor's methods on a Unix socket to `controller`
    mode: Literal["evaluate", "bridge"] = "evaluate"
    controller: str | None = Field(default=None, description="bridge: a Python script")
    controller_args: list[str] = []

    @field_validator("tasks")
    @classmethod
    def _tasks(
        cls, value: list[int | str] | TaskRange | None
    ) -> list[int | str] | TaskRange | None:
        if isinstance(value, list):
            if not value or len(value) > MAX_TASKS:
                raise ValueError(f"expected 1 to {MAX_TASKS} task ids")
            if len(set(map(str, value))) != len(value):
                raise ValueError("a task id is listed twice")
        return value

    @model_validator(mode="after")
    def _mode(self) -> AffinetesRequest:
        if self.mode == "evaluate" and self.tasks is None:
            raise ValueError("tasks: evaluate needs the task ids (or {range: [first, end]})")
        if self.mode == "bridge" and self.controller is None:
            raise ValueError("controller: a bridge needs the script that drives it")
        if self.mode == "evaluate" and self.controller is not None:
            raise ValueError("controller: only a bridge (mode: bridge) has one")
        return self

    def task_ids(self) -> list[int | str]:
        if isinstance(self.tasks, TaskRange):
            return list(range(*self.tasks.range))
        return list(self.tasks or [])


class AffinetesTask:
    name: ClassVar[str] = "affinetes"
    request_model: ClassVar[type[BaseModel]] = AffinetesRequest
    service_field: ClassVar[str] = "task.endpoint.service"

    def selector(self, request: AffinetesRequest) -> dict[str, str]:
        service = request.endpoint.service
        return {f"{SERVICE_LABEL}{service}": "yes"} if service else {}

    def shape(self, request: AffinetesRequest, base_dir: Path) -> ShapedTask:
        settings: dict[str, Any] = {
            "upstream_dir": f"../{UPSTREAM_DIR}",
            "environment": request.environment,
            "actor": request.actor,
            "tasks": request.task_ids(),
            "model": request.model,
            "endpoint": request.endpoint.model_dump(),
            "api_key_env": request.api_key_env,
            "concurrency": request.concurrency,
            "timeout_s": request.timeout_s,
            "evaluate_args": request.evaluate_args,
            "actor_args": request.actor_args,
            "mode": request.mode,
        }
        staged = [
            StagedPath(source=LAUNCHER, dest="workdir/orbit_affinetes.py"),
            StagedPath(source=BRIDGE, dest="workdir/orbit_affinetes_bridge.py"),
            StagedPath(source=PYENV, dest="workdir/orbit_affinetes_env.py"),
            StagedPath(source=EVALUATING, dest="workdir/orbit_affinetes_evaluate.py"),
            StagedPath(source=GIT_TREE, dest="workdir/orbit_git_tree.py"),
        ]
        if request.controller is not None:
            script = base_dir / request.controller
            if not script.is_file():
                raise InvalidInput(f"task.controller: no such file: {script}")
            staged.append(StagedPath(source=script, dest=f"workdir/controller/{script.name}"))
            settings["controller"] = f"controller/{script.name}"
            settings["controller_args"] = request.controller_args
        upstream = Upstream(
            repo=request.upstream.repo,  # relative to the spec, as task.sources' are
            commit=request.upstream.commit,
            path=UPSTREAM_DIR,
            field="task.upstream",
        )
        return ShapedTask(
            entrypoint=("python3", "orbit_affinetes.py"),
            request=request.model_dump(mode="json"),
            env={
                "ORBIT_AFFINETES": json.dumps(settings, sort_keys=True),
                "PYTHONDONTWRITEBYTECODE": "1",  # nothing written into the upstream's tree
                "PYTHONUNBUFFERED": "1",
            },
            staged=tuple(staged),
            upstreams=(upstream,),
            check_inputs=lambda inputs: check_environment(request, inputs / UPSTREAM_DIR),
        )


def check_environment(request: AffinetesRequest, tree: Path) -> None:
    """The environment and its actor, as the staged tree has them (read, never imported)."""
    env_py = tree / "environments" / request.environment / "env.py"
    if not env_py.is_file():
        folder = tree / "environments"
        found = [*folder.glob("*/env.py"), *folder.glob("*/*/env.py")]
        have = sorted(p.parent.relative_to(folder).as_posix() for p in found)
        raise InvalidInput(
            f"task.environment: commit {request.upstream.commit[:12]} has no "
            f"environments/{request.environment}/env.py (it has: {', '.join(have) or 'none'})"
        )
    try:
        module = ast.parse(env_py.read_bytes(), filename=str(env_py))
    except SyntaxError as exc:
        raise InvalidInput(f"task.environment: {env_py.name} does not parse: {exc}") from None
    actors = [
        node.name for node in module.body if isinstance(node, ast.ClassDef) and _evaluates(node)
    ]
    names = actors + _aliases(module, actors)  # `Actor = InfiniteActor`, upstream's own name
    if request.actor is not None:
        if request.actor not in names:
            raise InvalidInput(
                f"task.actor: environments/{request.environment}/env.py has no class "
                f"{request.actor} with an evaluate() (it has: {', '.join(names) or 'none'})"
            )
    elif "Actor" not in names and len(actors) != 1:
        raise InvalidInput(
            f"task.actor: environments/{request.environment}/env.py has "
            f"{'no class' if not actors else 'several classes'} with an evaluate()"
            f"{' (' + ', '.join(actors) + ')' if actors else ''}: name the actor"
        )


def _aliases(module: ast.Module, actors: list[str]) -> list[str]:
    """Module-level names bound to one of `actors` (`Actor = InfiniteActor`)."""
    found = []
    for node in module.body:
        if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Name):
            continue
        if node.value.id in actors:
            found += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return found


def _evaluates(node: ast.ClassDef) -> bool:
    return any(
        isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == "evaluate"
        for item in node.body
    )
