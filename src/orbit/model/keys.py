"""Unknown keys named with the nearest known one: `tsk: unknown key; did you mean task?`.

The known keys at a place in a file come from the pydantic model that reads it, walked along
the error's location (fields, dict values, list items, optional and union members); the
nearest is difflib's closest match. Pure: no I/O, no ORBIT imports beyond the standard ones."""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

CUTOFF = 0.6  # difflib's similarity below which nothing is offered
LISTED = 12  # at most this many known keys are listed when none is near


def nearest(word: str, known: Iterable[str]) -> str | None:
    """The known key closest to `word`, if any is close enough to be a likely typo."""
    found = difflib.get_close_matches(word, sorted(set(known)), n=1, cutoff=CUTOFF)
    if found:
        return found[0]
    lowered = {k.lower(): k for k in known}  # `Task`, `TASK`
    return lowered.get(word.lower())


def unknown_key(word: str, known: Iterable[str]) -> str:
    """`unknown key; did you mean task?`, or, with nothing near, the keys there are."""
    names = sorted(set(known))
    near = nearest(word, names)
    if near is not None:
        return f"unknown key; did you mean {near}?"
    if names and len(names) <= LISTED:
        return f"unknown key (known: {', '.join(names)})"
    return "unknown key"


def known_keys(model: Any, loc: Sequence[str | int]) -> list[str] | None:
    """The keys a mapping at `loc` (the location of one of its keys, less that key) may
    have, as `model` reads it; None where that is not a model's mapping."""
    here: Any = model
    for part in loc:
        here = _step(here, part)
        if here is None:
            return None
    model_at = _model(here)
    if model_at is None:
        return None
    return _fields(model_at)


def _fields(model: type[BaseModel]) -> list[str]:
    names = []
    for name, field in model.model_fields.items():
        names.append(field.alias or name)
    return names


def _unwrap(tp: Any) -> Any:
    """Annotated[X, ...] -> X; X | None -> X."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    if _is_union(tp):
        members = [a for a in get_args(tp) if a is not type(None)]
        if len(members) == 1:
            return _unwrap(members[0])
    return tp


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _model(tp: Any) -> type[BaseModel] | None:
    tp = _unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    return None


def _step(tp: Any, part: str | int) -> Any:
    """The type one step down `part` of a location, or None where it cannot be told."""
    tp = _unwrap(tp)
    model = _model(tp)
    if model is not None:
        for name, field in model.model_fields.items():
            if part in (name, field.alias):
                return field.annotation
        return None
    if _is_union(tp):  # pydantic names the member it tried: `ResourceAlternative`, `int`
        for member in get_args(tp):
            if getattr(_unwrap(member), "__name__", None) == part:
                return member
        models = [m for m in get_args(tp) if _model(m) is not None]
        return _step(models[0], part) if len(models) == 1 else None
    origin, args = get_origin(tp), get_args(tp)
    if origin is None or not args:
        return None
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return args[-1]
    if isinstance(origin, type) and issubclass(origin, Sequence | set | frozenset):
        return args[0] if isinstance(part, int) else None
    return None
