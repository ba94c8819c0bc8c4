"""Sweeps: one submission made into a group of runs, one per point of a grid or a list of
points. A point's values fill `{name}` placeholders in the task's arguments and env (task.args,
task.command, task.env) and reach the task as ORBIT_SWEEP_<NAME> too. Pure: the control plane
makes the runs (orbit.core.control.sweeps).

    sweep:
      grid:                    # every combination
        lr: [1e-4, 3e-4, 1e-3]
        seed: 0..4             # 0, 1, 2, 3, 4 (a step: 0..8..2)
      points:                  # exactly these (with a grid: each with every combination)
        - {warmup: 10, lr: 5e-4}

`orbit submit --sweep lr=1e-4,3e-4 --sweep seed=0..4` adds axes to the grid (replacing the
spec's axis of the same name)."""

from __future__ import annotations

import itertools
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationError

from orbit.model.errors import InvalidInput, describe_validation_error
from orbit.model.models import SWEEP_KEY_PATTERN, Strict, TaskSubmission, Text

MAX_POINTS = 10_000  # runs one sweep may make (a server's limits.sweep_points may lower it)
MAX_KEYS = 64  # keys of one sweep (TaskSubmission.point's)
KEY_PATTERN = SWEEP_KEY_PATTERN
KEY = KEY_PATTERN[1:-1]
# `{lr}` (the second group), not `${lr}` (a shell's); `{{lr}}` (the first) is written `{lr}`
PLACEHOLDER = re.compile(r"\{(\{" + KEY + r"\})\}|(?<!\$)\{(" + KEY + r")\}")
RANGE = re.compile(r"^(-?\d{1,18})\.\.(-?\d{1,18})(?:\.\.(\d{1,18}))?$")
FILLED = ("args", "command", "env")  # the task fields whose text a point fills
ENV_PREFIX = "ORBIT_SWEEP_"
MAX_VALUE = 4096  # characters of one value


def _axis(value: Any) -> Any:
    """An axis as written: values (numbers taken as written), or one text (`0..4`, `a,b`)."""
    if isinstance(value, list):
        return [_value(v) for v in value]
    return _value(value)


def _value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):  # YAML's true/false, as the task would read them
        return "true" if value else "false"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise ValueError("expected a list of values, a range A..B, or V1,V2,...")


Axis = Annotated[list[str] | str, BeforeValidator(_axis)]


class Sweep(Strict):
    """A spec's `sweep:` block, and what `--sweep` adds: axes of a grid (each a list of values,
    or a range `A..B[..STEP]`), and points given one by one."""

    grid: dict[str, Axis] = {}
    points: list[dict[str, Text]] = Field(default=[], max_length=MAX_POINTS)

    def keys(self) -> tuple[str, ...]:
        found = dict.fromkeys(self.grid)
        for point in self.points:
            found.update(dict.fromkeys(point))
        return tuple(found)


def sweep_points(
    submission: TaskSubmission, sweep: Sweep, source: str, max_points: int = MAX_POINTS
) -> list[TaskSubmission]:
    """One submission per point, its placeholders filled and the point recorded; refused,
    naming the field, for a sweep that is empty, too large, or fills the task badly."""
    points = expand(sweep, max_points, f"{source}: sweep")
    check_fills(submission.task_request, tuple(points[0]), source)
    return [
        submission.model_copy(
            update={"task_request": fill(submission.task_request, point), "point": point}
        )
        for point in points
    ]


def parse_sweep_flag(text: str) -> tuple[str, list[str]]:
    """`lr=1e-4,3e-4` -> ("lr", ["1e-4", "3e-4"]); `seed=0..4` -> ("seed", ["0", ..., "4"])."""
    key, sep, values = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise InvalidInput(f"--sweep {text!r}: expected NAME=V1,V2,... or NAME=A..B")
    _check_key(key, f"--sweep {key}")
    return key, axis_values(values.strip(), f"--sweep {key}")


def axis_values(value: list[str] | str, where: str, limit: int = MAX_POINTS) -> list[str]:
    """An axis's values: a list as it is, `A..B[..STEP]` as the integers from A to B (both
    included), or `V1,V2,...`; refused when empty or malformed, or with more than `limit`
    values (counted before any is made), naming `where`."""
    if isinstance(value, list):
        values = [str(v) for v in value]
    else:
        found = RANGE.match(value.strip())
        if found is not None:
            lo, hi, step = int(found[1]), int(found[2]), int(found[3] or 1)
            if step < 1 or hi < lo:
                raise InvalidInput(
                    f"{where}: range {value!r} is empty (A..B[..STEP] with A <= B and STEP >= 1)"
                )
            if (hi - lo) // step >= limit:
                raise InvalidInput(
                    f"{where}: range {value!r} has more than {limit:,} values (more points "
                    "than one sweep may make)"
                )
            values = [str(v) for v in range(lo, hi + 1, step)]
        elif ".." in value:
            raise InvalidInput(
                f"{where}: malformed range {value!r} (expected A..B or A..B..STEP, integers)"
            )
        else:
            values = [v.strip() for v in value.split(",")] if value.strip() else []
    if not values or any(v == "" for v in values):
        raise InvalidInput(f"{where}: expected one value or more (an empty one is not a value)")
    if len(values) > limit:
        raise InvalidInput(
            f"{where}: more than {limit:,} values (more points than one sweep may make)"
        )
    for v in values:
        if len(v) > MAX_VALUE or "\x00" in v:
            raise InvalidInput(f"{where}: a value over {MAX_VALUE} characters or holding NUL")
    if len(set(values)) != len(values):
        raise InvalidInput(f"{where}: a value is given twice")
    return values


def with_flags(sweep: Sweep | None, flags: list[str]) -> Sweep | None:
    """The spec's sweep with the axes of `--sweep` laid over its grid; None if neither."""
    if not flags:
        return sweep
    grid: dict[str, list[str] | str] = dict(sweep.grid) if sweep is not None else {}
    for flag in flags:
        key, values = parse_sweep_flag(flag)
        grid[key] = values
    points = sweep.points if sweep is not None else []
    return Sweep(grid=grid, points=points)


def sweep_of(data: Any, source: str) -> Sweep:
    """A sweep from its mapping, or from its JSON text (as a client sends it)."""
    try:
        if isinstance(data, str | bytes):
            return Sweep.model_validate_json(data)
        return Sweep.model_validate(data)
    except ValidationError as exc:
        line = describe_validation_error(source, exc, Sweep)
        raise InvalidInput(line.replace(f"{source}: ", f"{source}: sweep.", 1)) from None


def expand(
    sweep: Sweep, max_points: int = MAX_POINTS, where: str = "sweep"
) -> list[dict[str, str]]:
    """Every point, in order: the grid's combinations (its first axis slowest), each with every
    listed point laid over it. Refused, naming the field, if it has none or more than
    `max_points`, or if its keys are not all names."""
    _check_keys(sweep, where)
    axes: list[tuple[str, list[str]]] = []
    for key, value in sweep.grid.items():  # each no longer than the whole may be
        _check_key(key, f"{where}.grid.{key}")
        axes.append((key, axis_values(value, f"{where}.grid.{key}", max_points)))
    for index, point in enumerate(sweep.points):
        if not point:
            raise InvalidInput(f"{where}.points[{index}]: an empty point (give NAME: VALUE)")
        for key, value in point.items():
            _check_key(key, f"{where}.points[{index}].{key}")
            if len(value) > MAX_VALUE or "\x00" in value:
                raise InvalidInput(
                    f"{where}.points[{index}].{key}: a value over {MAX_VALUE} characters "
                    "or holding NUL"
                )
    if not axes and not sweep.points:
        raise InvalidInput(f"{where}: no points (give grid axes or points)")
    count = len(sweep.points) or 1
    for _, values in axes:
        count *= len(values)
        if count > max_points:
            break
    if count > max_points:
        raise InvalidInput(
            f"{where}: more than {max_points:,} points (the most one sweep may make; a "
            "server's limits.sweep_points): make it smaller or split it"
        )
    _no_clash(axes, sweep, where)
    names = [k for k, _ in axes]
    combos = [dict(zip(names, c, strict=True)) for c in itertools.product(*[v for _, v in axes])]
    listed = sweep.points or [{}]
    return [{**combo, **point} for combo in combos for point in listed]


def _check_keys(sweep: Sweep, where: str) -> None:
    """At most MAX_KEYS keys, no two the same variable (`lr` and `LR`: ORBIT_SWEEP_LR)."""
    keys = sweep.keys()
    if len(keys) > MAX_KEYS:
        raise InvalidInput(f"{where}: more than {MAX_KEYS} keys")
    seen: dict[str, str] = {}
    for key in keys:
        other = seen.setdefault(key.upper(), key)
        if other != key:
            raise InvalidInput(
                f"{where}: keys '{other}' and '{key}' would both be {ENV_PREFIX}{key.upper()}; "
                "name them apart"
            )


def _no_clash(axes: list[tuple[str, list[str]]], sweep: Sweep, where: str) -> None:
    """A key is either an axis of the grid or a field of the points, never both."""
    grid = {k for k, _ in axes}
    for index, point in enumerate(sweep.points):
        both = sorted(grid & set(point))
        if both:
            raise InvalidInput(
                f"{where}.points[{index}].{both[0]}: also an axis of the grid; give it in one"
            )
    keys = [set(p) for p in sweep.points]
    if keys and any(k != keys[0] for k in keys):
        raise InvalidInput(f"{where}.points: every point must name the same keys")


def _check_key(key: str, where: str) -> None:
    if not re.match(KEY_PATTERN, key):
        raise InvalidInput(
            f"{where}: not a sweep key (letters, digits and _, not starting with a digit)"
        )


def placeholders(task: dict[str, Any]) -> dict[str, str]:
    """Each placeholder the task's filled fields hold -> where it first is (`task.args[2]`)."""
    found: dict[str, str] = {}
    for name in FILLED:
        if name in task:
            for where, text in _texts(task[name], f"task.{name}"):
                for escaped, key in PLACEHOLDER.findall(text):
                    if not escaped:
                        found.setdefault(key, where)
    return found


def check_fills(task: dict[str, Any], keys: tuple[str, ...], source: str) -> None:
    """Every placeholder is a sweep key and every sweep key fills a placeholder."""
    found = placeholders(task)
    for key, where in found.items():
        if key not in keys:
            raise InvalidInput(
                f"{source}: {where}: placeholder {{{key}}} is filled by no sweep key "
                f"(keys: {', '.join(keys)}; write {{{{{key}}}}} to keep it as it is)"
            )
    for key in keys:
        if key not in found:
            raise InvalidInput(
                f"{source}: sweep key '{key}' fills nothing: write {{{key}}} where its value goes "
                f"in task.args, task.command or task.env"
            )


def fill(task: dict[str, Any], point: dict[str, str]) -> dict[str, Any]:
    """The task with the point's values in its placeholders (and `{{x}}` written `{x}`)."""
    filled = dict(task)
    for name in FILLED:
        if name in task:
            filled[name] = _fill(task[name], point)
    return filled


def sweep_env(point: dict[str, str]) -> dict[str, str]:
    """ORBIT_SWEEP_<KEY> for each of the point's values."""
    return {ENV_PREFIX + key.upper(): value for key, value in point.items()}


def _texts(value: Any, where: str) -> list[tuple[str, str]]:
    if isinstance(value, str):
        return [(where, value)]
    if isinstance(value, list):
        return [t for i, v in enumerate(value) for t in _texts(v, f"{where}[{i}]")]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in _texts(v, f"{where}.{k}")]
    return []


def _fill(value: Any, point: dict[str, str]) -> Any:
    if isinstance(value, str):
        return PLACEHOLDER.sub(lambda m: m[1] or point.get(m[2], m[0]), value)
    if isinstance(value, list):
        return [_fill(v, point) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, point) for k, v in value.items()}
    return value
