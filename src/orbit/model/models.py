"""The records ORBIT passes between its parts: pydantic v2, frozen where they are records."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

from orbit.model.dependencies import After

# the words every record uses, re-exported
from orbit.model.states import TERMINAL_STATES as TERMINAL_STATES
from orbit.model.states import FailureKind as FailureKind
from orbit.model.states import FailureReason as FailureReason
from orbit.model.states import RunState as RunState
from orbit.wire.leftout import LeavesOutEmpty

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


def _scalar_text(value: Any) -> Any:
    """YAML reads `200` and `0` as numbers; an argument or env value wants the text."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


# Command-line arguments and environment values: text, with numbers taken as written.
Text = Annotated[str, BeforeValidator(_scalar_text)]

# `secrets:` of a spec or a template: environment variable -> the name of a secret (orbit
# secrets set NAME), both an environment variable's shape; the values never come here
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
EnvName = Annotated[str, Field(pattern=ENV_NAME_PATTERN)]
SecretRefs = dict[EnvName, EnvName]
SWEEP_KEY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
SweepKey = Annotated[str, Field(pattern=SWEEP_KEY_PATTERN)]
SweepValue = Annotated[str, Field(max_length=4096)]


class Record(BaseModel):
    """A value that is never changed once made."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class Strict(BaseModel):
    """Input from a user: unknown keys are refused by name."""

    model_config = ConfigDict(extra="forbid", defer_build=True)


# GPU model names that mean "any model" (ORBIT's original templates write `unknown`)
ANY_GPU_TYPE = frozenset({"", "any", "unknown"})


def _gpu_type(value: str | None) -> str | None:
    return None if value is None or value.strip().lower() in ANY_GPU_TYPE else value


class ResourceAlternative(Strict):
    """One alternative of `resources.any_of`: what it leaves out, the resources above give."""

    gpu: str | int | None = None
    gpu_type: str | None = None
    gpu_count: int | None = Field(default=None, ge=0)
    gpu_memory_gb: float | None = Field(default=None, ge=0)
    cpu_count: int | None = Field(default=None, ge=0)
    memory_gb: float | None = Field(default=None, ge=0)
    disk_gb: float | None = Field(default=None, ge=0)


class Resources(Strict):
    """What a run needs. No gpu_type (or `unknown`) means any model; 0 CPUs or 0 GB of memory
    means no requirement. gpu_memory_gb reserves that much memory on each of its GPUs, so that
    runs whose reservations fit share a GPU (pool nodes); None or 0 takes whole GPUs. `gpu`
    is the compact form (`H100:80GB:2`, orbit.scheduler.resources), which takes the place of
    gpu_type and gpu_count; `any_of` lists alternatives in order, the first that fits wins."""

    gpu_type: Annotated[str | None, AfterValidator(_gpu_type)] = None
    gpu_count: int = Field(default=0, ge=0)
    cpu_count: int = Field(default=1, ge=0)
    memory_gb: float = Field(default=1.0, ge=0)
    gpu_memory_gb: float | None = Field(default=None, ge=0)
    gpu: str | int | None = None
    disk_gb: float | None = Field(default=None, ge=0)
    any_of: tuple[ResourceAlternative, ...] | None = None

    @model_serializer(mode="wrap")
    def _unset_left_out(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Unset, the newer fields are not written at all: job.json (so a bundle's digest)
        stays what it was before they existed, and an agent that predates them still reads
        the requests it is sent."""
        data = handler(self)
        if isinstance(data, dict):
            for key in ("gpu_memory_gb", "gpu", "disk_gb", "any_of"):
                if data.get(key) is None:
                    data.pop(key, None)
        return data


class Placement(BaseModel):
    """Where a run executes. Settings beyond `kind` belong to the placement's backend."""

    model_config = ConfigDict(frozen=True, extra="allow", defer_build=True)
    kind: str = Field(pattern=r"^[a-z][a-z0-9_]*$")


class LaunchMode(BaseModel):
    """How a run is started there, orthogonal to where."""

    model_config = ConfigDict(frozen=True, extra="allow", defer_build=True)
    kind: str = Field(pattern=r"^[a-z][a-z0-9_]*$")


class ExecutionDefaults(Strict):
    target: str | None = None
    # scheduling (agent pools): the queue's tier, whether more urgent work may push it off,
    # labels a node must have beside the template's placement.selector, nodes at once
    priority: str = "normal"
    preemptible: bool = False
    selector: dict[str, Text] = {}
    num_nodes: int = Field(default=1, ge=1, le=1024)
    detach: bool = True
    resources: Resources = Resources()
    runtime_env: dict[str, Text] = {}
    secrets: SecretRefs = {}  # env name -> secret name, resolved for the submitter at launch
    stop_grace_s: float = Field(default=10.0, ge=0, le=3600)
    # stopped gracefully (reason max_runtime) once it has run this long; none: no limit
    max_runtime_s: float | None = Field(default=None, gt=0)


class ExecutionTemplate(Record):
    id: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    placement: Placement
    launch_mode: LaunchMode
    defaults: ExecutionDefaults = ExecutionDefaults()
    allow_overrides: tuple[str, ...] = ()

    @field_validator("allow_overrides")
    @classmethod
    def _known_fields(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        for path in paths:
            if not is_overridable(path):
                raise ValueError(
                    f"'{path}' is not a field a submission can override "
                    f"(known: {', '.join(overridable_paths())})"
                )
        return paths


class ResourcesOverride(Strict):
    gpu_type: str | None = None
    gpu_count: int | None = Field(default=None, ge=0)
    cpu_count: int | None = Field(default=None, ge=0)
    memory_gb: float | None = Field(default=None, ge=0)
    gpu_memory_gb: float | None = Field(default=None, ge=0)
    gpu: str | int | None = None
    disk_gb: float | None = Field(default=None, ge=0)
    any_of: tuple[ResourceAlternative, ...] | None = None


# A container image reference as docker takes it (`repo:tag`, `repo@sha256:...`, an id).
IMAGE_REF = r"^\S+$"


class ExecutionOverrides(Strict):
    """What a submission asks to change in its template's defaults. Only set fields count."""

    target: str | None = None
    detach: bool | None = None
    priority: str | None = None
    preemptible: bool | None = None
    selector: dict[str, Text] | None = None
    num_nodes: int | None = Field(default=None, ge=1, le=1024)
    resources: ResourcesOverride | None = None
    runtime_env: dict[str, Text] | None = None
    secrets: SecretRefs | None = None
    stop_grace_s: float | None = Field(default=None, ge=0, le=3600)
    max_runtime_s: float | None = Field(default=None, gt=0)
    # the container image of a docker launch mode: lands in launch_mode.image, so in job.json
    image: str | None = Field(default=None, pattern=IMAGE_REF)


# overridable fields that are maps by name: `runtime_env.HF_HOME` overrides one entry
MAPS = ("runtime_env", "selector", "secrets")


def overridable_paths() -> list[str]:
    paths = []
    for name in ExecutionOverrides.model_fields:
        paths.append(name)
        if name == "resources":
            paths += [f"resources.{r}" for r in ResourcesOverride.model_fields]
        elif name in MAPS:
            paths.append(f"{name}.NAME")
    return paths


def is_overridable(path: str) -> bool:
    head, _, rest = path.partition(".")
    if head not in ExecutionOverrides.model_fields:
        return False
    if not rest:
        return True
    if head == "resources":
        return rest in ResourcesOverride.model_fields
    return head in MAPS and "." not in rest


# Fields of an override that belong to one attempt and never reach the bundle: a retry may
# change them and still push the same bundle.
ATTEMPT_FIELDS = frozenset({"target", "detach"})


class ExecutionRequest(Record, LeavesOutEmpty):
    """A template with the submission's overrides applied: everything a backend needs."""

    # no secrets, no key: a stored request, and what an agent that predates them reads, stay
    # as they were
    LEFT_OUT_EMPTY = ("secrets",)

    template_id: str
    placement: Placement
    launch_mode: LaunchMode
    target: str | None
    detach: bool
    resources: Resources
    runtime_env: dict[str, str]
    stop_grace_s: float
    max_runtime_s: float | None = None
    priority: str = "normal"
    preemptible: bool = False
    selector: dict[str, str] = {}
    num_nodes: int = 1
    # env name -> secret name: references, resolved for the run's submitter at each launch
    secrets: dict[str, str] = {}

    @property
    def backend_key(self) -> str:
        return f"{self.placement.kind}_{self.launch_mode.kind}"


class RetryPolicy(Record):
    """Automatic retries: infrastructure failures always qualify, a task's exit only if listed."""

    max_retries: int = Field(default=2, ge=0, le=100)
    on_exit_codes: tuple[int, ...] = ()
    # the first automatic retry waits backoff_s, each next one twice as long, up to the cap
    backoff_s: float = Field(default=10.0, ge=0, le=3600)
    backoff_max_s: float = Field(default=600.0, ge=0, le=86400)


class TaskSubmission(Record):
    experiment_id: str
    task_type: str
    task_request: dict[str, Any]
    template_id: str
    overrides: ExecutionOverrides = ExecutionOverrides()
    retry: RetryPolicy = RetryPolicy()
    allow_dirty: bool = False  # stage dirty git sources, recording their diff
    # queue an agent-pool run that no registered node could hold (for nodes yet to join)
    queue_anyway: bool = False
    after: After | None = None  # runs it waits for (orbit.model.dependencies); full ids once made
    # the values of the sweep point it was made for (orbit.model.sweeps): its task gets each as
    # ORBIT_SWEEP_<KEY>; none for a run submitted on its own
    point: dict[SweepKey, SweepValue] = Field(default={}, max_length=64)


class PrecheckSpec(Record, LeavesOutEmpty):
    """What the precheck verifies in the task's own interpreter before the task starts."""

    # no optional imports, no key: job.json (so a bundle's digest) stays as it was
    LEFT_OUT_EMPTY = ("optional_imports",)
    interpreter: str = "python3"
    critical_imports: tuple[str, ...] = ()
    optional_imports: tuple[str, ...] = ()  # recorded; absent ones are said, not fatal


class JobSpec(Record, LeavesOutEmpty):
    """job.json: what runs, frozen into the bundle. No run, attempt or placement details."""

    LEFT_OUT_EMPTY = ("secrets",)  # no secrets, no key: a bundle's digest stays as it was

    schema_version: int = 1
    task_type: str
    template_id: str
    launch_mode: LaunchMode
    entrypoint: tuple[str, ...] = Field(min_length=1)
    workdir: str = "workdir"
    env: dict[str, str] = {}
    resources: Resources = Resources()
    stop_grace_s: float = 10.0
    precheck: PrecheckSpec = PrecheckSpec()
    task_request: dict[str, Any] = {}
    # env name -> secret name: what the wrapper is given at launch (never a value here)
    secrets: dict[str, str] = {}


class RunHandle(Record):
    """What a backend needs to find an attempt again; never a live connection."""

    backend_key: str
    target: str
    attempt_id: str
    location: str
    data: dict[str, Any] = {}


class RunStatus(Record):
    """An attempt's state as the execution plane reports it (rebuilt from runtime/ files)."""

    state: RunState
    reason: FailureReason | None = None
    exit_code: int | None = None
    signal: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    host: str | None = None
    message: str | None = None
