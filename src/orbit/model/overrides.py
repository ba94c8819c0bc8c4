"""Applying a submission's overrides to a template: the whitelist check and the merge. Pure."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from orbit.model.errors import InvalidInput, Refused, describe_validation_error
from orbit.model.launch_modes import resolve_launch_mode
from orbit.model.models import ExecutionOverrides, ExecutionRequest, ExecutionTemplate


def parse_overrides(raw: dict[str, Any], source: str) -> ExecutionOverrides:
    try:
        return ExecutionOverrides.model_validate(raw)
    except ValidationError as exc:
        raise InvalidInput(describe_validation_error(source, exc, ExecutionOverrides)) from None


def set_paths(overrides: ExecutionOverrides) -> list[str]:
    """The dotted paths a submission sets: `resources.gpu_count`, `runtime_env.HF_HOME`, ..."""
    paths: list[str] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                walk(f"{prefix}.{key}", inner)
        else:
            paths.append(prefix)

    for key, value in overrides.model_dump(exclude_unset=True).items():
        walk(key, value)
    return paths


def is_allowed(path: str, allowed: tuple[str, ...]) -> bool:
    """A path is allowed when it, or a folder above it, is listed: `resources` allows all of it."""
    parts = path.split(".")
    return any(".".join(parts[:n]) in allowed for n in range(1, len(parts) + 1))


def check_whitelist(template: ExecutionTemplate, overrides: ExecutionOverrides) -> None:
    for path in set_paths(overrides):
        if not is_allowed(path, template.allow_overrides):
            allowed = ", ".join(template.allow_overrides) or "nothing"
            raise Refused(
                f"override '{path}' is not allowed by template '{template.id}' "
                f"(allow_overrides: {allowed})"
            )


def merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def resolve(template: ExecutionTemplate, overrides: ExecutionOverrides) -> ExecutionRequest:
    """The template's defaults with the allowed overrides laid over them."""
    check_whitelist(template, overrides)
    values = merge(template.defaults.model_dump(), overrides.model_dump(exclude_unset=True))
    # `image` is the one override that lands in the launch mode rather than the defaults
    launch_mode = resolve_launch_mode(template.launch_mode, values.pop("image", None), template.id)
    if values.get("target") == "":  # an empty target is none given
        values["target"] = None
    try:
        return ExecutionRequest(
            template_id=template.id,
            placement=template.placement,
            launch_mode=launch_mode,
            **values,
        )
    except ValidationError as exc:  # e.g. `--set resources.gpu_count=null`: set, but to nothing
        raise InvalidInput(describe_validation_error("overrides", exc)) from None
