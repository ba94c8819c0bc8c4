"""Reading the user's YAML files, with one-line errors that name the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from orbit.model.errors import InvalidInput


def load_yaml_mapping(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInput(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path}: cannot read: {exc}") from None
    return parse_yaml_mapping(text, str(path))


def parse_yaml_mapping(text: str, source: str) -> dict[str, Any]:
    """The mapping a YAML text holds; errors name `source` (a file, or what sent it)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise InvalidInput(f"{source}: invalid YAML{where}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InvalidInput(
            f"{source}: expected a mapping at the top level, got {type(data).__name__}"
        )
    return data


def parse_scalar(text: str) -> Any:
    """`--set key=value` values: YAML scalars, so `2`, `true`, `[3, 4]` mean what they look like."""
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text
