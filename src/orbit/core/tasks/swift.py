"""`swift`: ms-swift's own command lines (`swift sft`, `swift rlhf --rlhf_type grpo`,
`swift rollout`, ...),
checked before anything is frozen against the argument names of the ms-swift version the
request declares (lists shipped in swift_args/, made by tools/swift_args.py from the real
package's argument dataclasses). On the node, orbit/runtime/swift_launch.py (staged into the
workdir, run with the request's interpreter) sets the attempt's GPUs, ports, output folder
and resume, then becomes `swift`."""

from __future__ import annotations

import json
import math
import os
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from orbit.core.tasks.command import stage_folder
from orbit.model.errors import InvalidInput
from orbit.model.models import ExecutionRequest, Resources
from orbit.model.nodes import SERVICE_LABEL
from orbit.model.task import ShapedTask, StagedPath

LAUNCHER = Path(__file__).resolve().parents[2] / "runtime" / "swift_launch.py"
ARG_LISTS = Path(__file__).resolve().parent / "swift_args"
DEFAULT_VERSION = "4.6.0"
# given as the request's own fields, never in args: ORBIT shapes or sets them
OWN_FIELDS = ("model", "dataset", "output_dir", "rlhf_type", "tuner_type", "train_type")
ORBIT_SETS = ("vllm_server_group_port", "use_vllm", "vllm_mode")
ROLLOUT_HAS_NO = {
    "output_dir": "`swift rollout` writes no output_dir: it serves on args.port",
    "vllm": "for the GRPO trainer (mode rlhf); `swift rollout` is the vLLM server itself",
}
CRITICAL = ("swift", "torch", "transformers", "peft", "trl")
OPTIONAL = ("deepspeed", "vllm", "flash_attn")

Scalar = str | int | float | bool
ArgValue = Scalar | list[Scalar] | dict[str, Any] | None


class VllmSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["colocate", "server"]
    # server mode: the rollout server (`swift rollout`) the trainer talks to, given here, in
    # an env var on the node (http://HOST:PORT or HOST:PORT), or as a service the node
    # advertises (orbit agent --service NAME=URL): the run is placed on such a node
    server_host: str | None = None
    server_port: int | None = Field(default=None, ge=1, le=65535)
    endpoint_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    service: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")

    @model_validator(mode="after")
    def _endpoint(self) -> VllmSettings:
        given = (self.server_host and self.server_port) or self.endpoint_env or self.service
        if self.mode == "server" and not given:
            raise ValueError(
                "mode server needs the rollout server: server_host and server_port, "
                "endpoint_env naming the env var on the node that holds http://HOST:PORT, or "
                "service naming one the node advertises (orbit agent --service NAME=URL)"
            )
        if self.service and (self.server_host or self.server_port or self.endpoint_env):
            raise ValueError("give service or server_host/server_port/endpoint_env, not both")
        return self


class SwiftRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["sft", "rlhf", "pt", "infer", "eval", "rollout"]
    rlhf_type: str | None = None
    model: str = Field(min_length=1, description="a hub id or a path on the node")
    dataset: list[str] = []
    tuner_type: str | None = None
    train_type: str | None = Field(default=None, description="ms-swift 3.x's name of tuner_type")
    output_dir: str | None = Field(
        default=None, description="default $ORBIT_ARTIFACTS_DIR/checkpoints; relative: under it"
    )
    args: dict[str, ArgValue] = {}
    vllm: VllmSettings | None = None
    version: str = Field(default=DEFAULT_VERSION, pattern=r"^\d+\.\d+(\.\d+)?$")
    interpreter: str = Field(default="python3", min_length=1, description="the python with swift")
    env: dict[str, str] = {}
    # a folder staged as the task's working directory: model and dataset paths relative to
    # it are found there (a small model or a dataset shipped with the spec)
    workdir: str | None = None

    @model_validator(mode="after")
    def _shape(self) -> SwiftRequest:
        if self.mode == "rlhf" and self.rlhf_type is None:
            raise ValueError("mode rlhf needs rlhf_type (grpo, dpo, kto, ...)")
        if self.mode != "rlhf" and self.rlhf_type is not None:
            raise ValueError(f"rlhf_type is for mode rlhf, not {self.mode}")
        if self.tuner_type is not None and self.train_type is not None:
            raise ValueError("give tuner_type or train_type (its 3.x name), not both")
        if self.mode in ("sft", "pt", "rlhf") and not self.dataset:
            raise ValueError(f"mode {self.mode} needs a dataset")
        return self

    @field_validator("output_dir", "vllm")
    @classmethod
    def _not_for_rollout(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and info.data.get("mode") == "rollout":
            raise ValueError(ROLLOUT_HAS_NO[info.field_name or ""])
        return value


@cache
def argument_names(version: str) -> dict[str, Any]:
    """The shipped list for `version`: exactly it, else the newest of its major.minor."""
    lists = {p.stem: p for p in ARG_LISTS.glob("*.json")}
    path = lists.get(version)
    if path is None:
        same = sorted(
            (v for v in lists if v.split(".")[:2] == version.split(".")[:2]),
            key=lambda v: tuple(map(int, v.split("."))),
        )
        if not same:
            known = ", ".join(sorted(lists))
            raise InvalidInput(
                f"task.version: no argument list for ms-swift {version} (shipped: {known}; "
                "tools/swift_args.py makes one)"
            )
        path = lists[same[-1]]
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _flag(value: ArgValue) -> list[str]:
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, list):
        return [_flag(v)[0] for v in value]
    if isinstance(value, dict):
        return [json.dumps(value, sort_keys=True)]
    return [str(value)]


class SwiftTask:
    name: ClassVar[str] = "swift"
    request_model: ClassVar[type[BaseModel]] = SwiftRequest
    service_field: ClassVar[str] = "task.vllm.service"  # the rollout server, by name

    def selector(self, request: SwiftRequest) -> dict[str, str]:
        """GRPO's rollout server asked for by name: only a node advertising it will do."""
        service = request.vllm.service if request.vllm else None
        return {f"{SERVICE_LABEL}{service}": "yes"} if service else {}

    def shape(self, request: SwiftRequest, base_dir: Path) -> ShapedTask:
        known = argument_names(request.version)
        argv = self.arguments(request, known)
        settings: dict[str, Any] = {
            "subcommand": request.mode,
            "argv": argv,
            "version": request.version,
            "output_dir": request.output_dir,
            "vllm": request.vllm.model_dump(exclude_none=True) if request.vllm else None,
        }
        if request.mode == "rollout":
            settings["port"] = rollout_port(request, known)
        critical, optional = imports(request)
        folder = (
            () if request.workdir is None else (stage_folder(base_dir, "workdir", request.workdir),)
        )
        return ShapedTask(
            entrypoint=(request.interpreter, "swift_launch.py"),
            request=request.model_dump(exclude_defaults=True) | {"version": request.version},
            env={"PYTHONUNBUFFERED": "1", **request.env, "ORBIT_SWIFT": json.dumps(settings)},
            staged=(*folder, StagedPath(source=LAUNCHER, dest="workdir/swift_launch.py")),
            interpreter=request.interpreter,
            critical_imports=critical,
            optional_imports=optional,
        )

    def arguments(self, request: SwiftRequest, known: dict[str, Any]) -> list[str]:
        """The argument list after `swift MODE`, every name checked against `known`."""
        names = set(known["modes"][request.mode])
        for name in request.args:
            where = f"task.args.{name}"
            if name in OWN_FIELDS:
                raise InvalidInput(f"{where}: give it as task.{name}, not in args")
            if name in ORBIT_SETS:
                raise InvalidInput(f"{where}: ORBIT sets it (task.vllm)")
            if name not in names:
                raise InvalidInput(
                    f"{where}: ms-swift {known['version']} `swift {request.mode}` has no "
                    f"argument {name!r}{_nearest(name, names)}"
                )
        major = int(known["version"].split(".")[0])
        tuner_name = "train_type" if major < 4 else "tuner_type"
        tuner = request.tuner_type or request.train_type
        if request.rlhf_type is not None:
            choices = known.get("rlhf_types") or []
            if choices and request.rlhf_type not in choices:
                raise InvalidInput(
                    f"task.rlhf_type: {request.rlhf_type!r} is not one of ms-swift "
                    f"{known['version']}'s: {', '.join(choices)}"
                )
        argv = ["--model", request.model]
        if request.rlhf_type is not None:
            argv = ["--rlhf_type", request.rlhf_type, *argv]
        if request.dataset:
            argv += ["--dataset", *request.dataset]
        if tuner is not None and tuner_name in names:
            argv += [f"--{tuner_name}", tuner]
        elif tuner is not None:
            raise InvalidInput(f"task.tuner_type: `swift {request.mode}` takes no tuner type")
        for name, value in request.args.items():
            if value is not None:
                argv += [f"--{name}", *_flag(value)]
        if request.rlhf_type == "grpo":
            check_rewards(request)
        if request.vllm is not None:
            argv += ["--use_vllm", "true", "--vllm_mode", request.vllm.mode]
            if request.vllm.server_host and request.vllm.server_port:
                host, port = request.vllm.server_host, str(request.vllm.server_port)
                argv += ["--vllm_server_host", host, "--vllm_server_port", port]
        return argv

    def check_placement(self, request: SwiftRequest, execution: ExecutionRequest) -> None:
        """What needs the placement's size: GRPO's generation batch, one training process per
        GPU on each node (one on CPU); and on this machine (a local placement), a model given
        as an absolute path must be there (a hub id or a path on another node is its to find)."""
        model = os.path.expanduser(request.model)
        here = execution.placement.kind == "local" and os.path.isabs(model)
        if here and not os.path.exists(model):
            raise InvalidInput(
                f"task.model: no such path on this machine, where a local run reads it: {model}"
            )
        if request.rlhf_type == "grpo":
            processes = max(1, gpu_count(execution.resources)) * execution.num_nodes
            check_generation_batch(request, argument_names(request.version), processes)


def rollout_port(request: SwiftRequest, known: dict[str, Any]) -> int:
    """The port `swift rollout` serves on: args.port, else ms-swift's default (8000)."""
    port = request.args.get("port", known.get("defaults", {}).get("rollout", {}).get("port"))
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise InvalidInput(f"task.args.port: a port number (1-65535), got {port!r}")
    return port


def gpu_count(resources: Resources) -> int:
    if resources.gpu is None:
        return resources.gpu_count
    from orbit.scheduler.resources import parse_gpu  # the compact form, H100:80GB:2

    return parse_gpu(resources.gpu).count


def check_rewards(request: SwiftRequest) -> None:
    if request.args.get("reward_funcs") in (None, [], "") and not request.args.get("reward_model"):
        raise InvalidInput(
            "task.args.reward_funcs: GRPO needs reward functions (e.g. [accuracy, format]) "
            "or args.reward_model"
        )


def check_generation_batch(request: SwiftRequest, known: dict[str, Any], processes: int) -> None:
    """What ms-swift would refuse at start, after the model has loaded: a generation batch
    (per device x training processes x steps per generation) that num_generations does not
    divide. Steps per generation default to the accumulation steps, as ms-swift's do."""
    defaults = known.get("defaults", {}).get("rlhf", {})

    def number(name: str) -> int | None:
        value = request.args.get(name, defaults.get(name))
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise InvalidInput(f"task.args.{name}: a whole number, got {value!r}")
        if value is not None and value < 1:
            raise InvalidInput(f"task.args.{name}: at least 1, got {value}")
        return value

    batch, generations = number("per_device_train_batch_size") or 1, number("num_generations")
    if not generations or generations == 1:
        return
    given = number("generation_batch_size")
    if given is not None:
        said, total = f"generation_batch_size {given}", given
    else:
        steps = number("steps_per_generation") or number("gradient_accumulation_steps")
        steps = steps or max(1, math.ceil(16 / batch / processes))  # ms-swift's own default
        total = batch * processes * steps
        said = (
            f"per_device_train_batch_size {batch} x {processes} processes x "
            f"steps_per_generation {steps} = {total}"
        )
    if total % generations:
        raise InvalidInput(
            f"task.args.num_generations: {said} is not divisible by num_generations "
            f"{generations} (each prompt's completions must fall in one batch)"
        )


def imports(request: SwiftRequest) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Critical imports (the run cannot work without them) and optional ones (recorded, and
    said once when absent); an optional one the request uses is critical."""
    critical, optional = list(CRITICAL), list(OPTIONAL)
    uses = {
        "deepspeed": "deepspeed" in request.args,
        "vllm": request.vllm is not None
        or request.mode == "rollout"
        or request.args.get("infer_backend") == "vllm",
        "flash_attn": str(request.args.get("attn_impl", "")).startswith("flash_att"),
    }
    for name, used in uses.items():
        if used:
            optional.remove(name)
            critical.append(name)
    if request.rlhf_type == "grpo":
        critical.append("msgspec")  # ms-swift needs it for GRPO and does not declare it
        funcs = request.args.get("reward_funcs")
        if "accuracy" in (funcs if isinstance(funcs, list) else [funcs]):
            critical.append("math_verify")
    return tuple(critical), tuple(optional)


def _nearest(name: str, names: set[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, names, n=3)
    return f" (did you mean {', '.join(close)}?)" if close else ""
