"""SPEC.yaml, the file `orbit submit` takes, and `--set key=value` overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from orbit.model.dependencies import After, not_a_run
from orbit.model.errors import InvalidInput, describe_validation_error
from orbit.model.models import NAME_PATTERN, RetryPolicy, SecretRefs, Strict, TaskSubmission
from orbit.model.overrides import merge, parse_overrides
from orbit.model.sweeps import Sweep
from orbit.model.yamlio import load_yaml_mapping, parse_scalar


class SubmitSpec(Strict):
    experiment: str = Field(pattern=NAME_PATTERN)
    task_type: str
    template: str
    task: dict[str, Any]
    overrides: dict[str, Any] = {}
    retry: RetryPolicy = RetryPolicy()
    # the queue's tier and whether more urgent work may push it off (agent pools); the
    # template gives the defaults and must allow overriding them
    priority: str | None = None
    preemptible: bool | None = None
    # runs this one waits for: {ok: [RUN...], any: [RUN...]} (orbit.model.dependencies)
    after: After | None = None
    # env name -> secret name (orbit secrets set NAME): the task gets each secret's value in
    # that variable; an override of the template's `secrets`, so it must allow them
    secrets: SecretRefs | None = None
    # one run per point: {grid: {lr: [1e-4, 3e-4], seed: 0..4}, points: [{...}]}, its values
    # in the task's {lr} placeholders (orbit.model.sweeps); --sweep adds to its grid
    sweep: Sweep | None = None


def parse_sets(sets: list[str]) -> dict[str, Any]:
    """`["resources.gpu_count=2", "target=h100-a"]` -> `{"resources": {"gpu_count": 2}, ...}`."""
    out: dict[str, Any] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise InvalidInput(f"--set {item!r}: expected key=value, e.g. --set target=h100-a")
        if parts == ["template"]:  # not an override: it names what overrides apply to
            raise InvalidInput(
                f"--set {item!r}: the template is not an override; use --template {value.strip()}"
            )
        nested: Any = parse_scalar(value)
        for part in reversed(parts):
            nested = {part: nested}
        out = merge(out, nested)
    return out


def load_spec(path: Path, sets: list[str] | None = None, template: str | None = None) -> SubmitSpec:
    """The spec file with `--set` overrides laid over its own, and `template` (`--template`)
    in place of (or in the absence of) its `template:`. The overrides are checked against
    the template the run ends up with, whichever gave it."""
    data = load_yaml_mapping(path)
    if template is not None:
        data = {**data, "template": template}
    return spec_of(data, str(path), sets)


def spec_of(data: dict[str, Any], source: str, sets: list[str] | None = None) -> SubmitSpec:
    try:
        spec = SubmitSpec.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput(describe_validation_error(source, exc, SubmitSpec)) from None
    if sets:
        spec = spec.model_copy(update={"overrides": merge(spec.overrides, parse_sets(sets))})
    return spec


def add_after(spec: SubmitSpec, ok: list[str], any_: list[str]) -> SubmitSpec:
    """The spec with the runs of `--after` (after.ok) and `--after-any` (after.any) added to
    what its own `after:` names."""
    if not ok and not any_:
        return spec
    for flag, refs in (("--after", ok), ("--after-any", any_)):
        for ref in refs:
            why = not_a_run(ref)
            if why is not None:
                raise InvalidInput(f"{flag}: {why}")
    have = spec.after or After()
    try:
        after = After(ok=(*have.ok, *ok), any=(*have.any, *any_))
    except ValidationError as exc:
        raise InvalidInput(describe_validation_error("--after", exc)) from None
    return spec.model_copy(update={"after": after})


def to_submission(
    spec: SubmitSpec, source: str, allow_dirty: bool = False, queue_anyway: bool = False
) -> TaskSubmission:
    return TaskSubmission(
        experiment_id=spec.experiment,
        task_type=spec.task_type,
        task_request=spec.task,
        template_id=spec.template,
        overrides=parse_overrides(_with_top_level(spec), f"{source}: overrides"),
        retry=spec.retry,
        allow_dirty=allow_dirty,
        queue_anyway=queue_anyway,
        after=spec.after or None,
    )


def _with_top_level(spec: SubmitSpec) -> dict[str, Any]:
    """The spec's overrides with its top-level priority, preemptible and secrets laid over
    them."""
    fields = ("priority", "preemptible", "secrets")
    extra = {k: v for k in fields if (v := getattr(spec, k)) is not None}
    return merge(spec.overrides, extra)
