"""The accelerator half of the resource descriptor: the models ORBIT knows, how a node's NVML
name maps onto them, and the compact way a request names what it needs.

A request writes `gpu: MODELS:MEMORY:COUNT`, each part optional and told apart by its shape:

    H100              one H100 (the family: H100-80GB or H100-NVL)
    H100:2            two
    A100-80GB:2       two A100s with 80 GB each
    :80GB:2           two of any model with at least 80 GB each
    A100..H100:4      four of any model from A100 (40 GB) up to H100, in the catalog's order
    [H100, A100-80GB] one of these
    4                 four of any model;  none (or 0): no accelerator

MEMORY is a number with GB (or G, GiB); COUNT a bare integer; the rest names models. A name
is a catalog model (`A100-80GB`) or a family (`A100`: every memory size of it); no model is
named like a family, so that every ask writes itself back the same. Pure: no I/O.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from orbit.model.errors import InvalidInput


@dataclass(frozen=True)
class Model:
    name: str  # the catalog's name, as requests and `orbit nodes` write it
    family: str  # what a request naming the family matches (A100: both memory sizes)
    kind: str  # gpu | tpu
    vendor: str
    memory_gb: float
    rank: int  # the catalog's order, roughly by capability: what a range A..B spans


# (name, family, kind, vendor, memory GB), in rank order
_CATALOG = (
    ("T4", "T4", "gpu", "nvidia", 16),
    ("A10G", "A10G", "gpu", "nvidia", 24),
    ("A10", "A10", "gpu", "nvidia", 24),
    ("L4", "L4", "gpu", "nvidia", 24),
    ("A40", "A40", "gpu", "nvidia", 48),
    ("L40S", "L40S", "gpu", "nvidia", 48),
    ("A100-40GB", "A100", "gpu", "nvidia", 40),
    ("A100-80GB", "A100", "gpu", "nvidia", 80),
    ("H100-80GB", "H100", "gpu", "nvidia", 80),
    ("H100-NVL", "H100", "gpu", "nvidia", 94),
    ("H200", "H200", "gpu", "nvidia", 141),
    ("B200", "B200", "gpu", "nvidia", 180),
    ("MI250X", "MI250X", "gpu", "amd", 128),
    ("MI300X", "MI300X", "gpu", "amd", 192),
    ("TPU-v5e", "TPU-v5e", "tpu", "google", 16),
    ("TPU-v5p", "TPU-v5p", "tpu", "google", 95),
)
MODELS: dict[str, Model] = {
    name.upper(): Model(name, family, kind, vendor, float(memory), rank)
    for rank, (name, family, kind, vendor, memory) in enumerate(_CATALOG)
}
FAMILIES: dict[str, tuple[Model, ...]] = {}
for _model in MODELS.values():
    FAMILIES[_model.family.upper()] = (*FAMILIES.get(_model.family.upper(), ()), _model)

_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)\s*(?:GB|G|GIB)$", re.IGNORECASE)
_NONE = {"NONE", "0", "CPU"}


@dataclass(frozen=True)
class GpuAsk:
    """What a request asks of accelerators. `models`: the catalog names any of which will do
    (empty: any model); `memory_gb`: at least this much on each; `count`: how many (0: none)."""

    models: tuple[str, ...] = ()
    memory_gb: float | None = None
    count: int = 1

    def matches(self, model: str | None, memory_gb: float) -> bool:
        """Whether one accelerator (its catalog model, if known, and its memory) will do."""
        if self.models and model not in self.models:
            return False
        return self.memory_gb is None or memory_gb >= self.memory_gb

    def text(self) -> str:
        """The compact form, which `parse_gpu` reads back to this ask."""
        if self.count == 0:
            return "none"
        parts = []
        if self.models:
            parts.append(self.models[0] if len(self.models) == 1 else f"[{', '.join(self.models)}]")
        if self.memory_gb is not None:
            parts.append(f"{self.memory_gb:g}GB")
        if self.count != 1 or not parts:
            parts.append(str(self.count))
        return ":".join(parts)


def _known(name: str, field: str) -> tuple[Model, ...]:
    """The catalog models a name stands for: a model, or every model of a family."""
    key = name.strip().upper()
    if key in FAMILIES:  # H100: the H100-80GB and the H100-NVL alike
        return FAMILIES[key]
    if key in MODELS:
        return (MODELS[key],)
    choices = sorted({m.name for m in MODELS.values()} | {m.family for m in MODELS.values()})
    near = difflib.get_close_matches(name.strip(), choices, n=3, cutoff=0.6)
    hint = f"; nearest known: {', '.join(near)}" if near else f"; known: {', '.join(choices)}"
    raise InvalidInput(f"{field}: unknown accelerator model '{name.strip()}'{hint}")


def _models(text: str, field: str) -> tuple[str, ...]:
    text = text.strip()
    if text.upper() in ("", "ANY"):
        return ()
    if text.startswith("[") and text.endswith("]"):
        names = [n for n in text[1:-1].split(",") if n.strip()]
        if not names:
            raise InvalidInput(f"{field}: an empty list of models; leave it out for any model")
        found = [m for n in names for m in _known(n, field)]
    elif ".." in text:
        low, _, high = text.partition("..")
        lows, highs = _known(low, field), _known(high, field)
        first, last = min(m.rank for m in lows), max(m.rank for m in highs)
        if first > last:
            raise InvalidInput(
                f"{field}: range '{text}' runs backwards; write it low..high "
                f"({high.strip()}..{low.strip()})"
            )
        found = [m for m in MODELS.values() if first <= m.rank <= last]
    else:
        found = list(_known(text, field))
    return tuple(dict.fromkeys(m.name for m in sorted(found, key=lambda m: m.rank)))


def parse_gpu(value: str | int | None, field: str = "resources.gpu") -> GpuAsk:
    """The compact form (see the module's docstring) as a GpuAsk; InvalidInput naming `field`
    and what was expected when it does not read."""
    if value is None:
        return GpuAsk(count=0)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidInput(f"{field}: expected MODELS:MEMORY:COUNT, e.g. 'H100:80GB:2'")
    if isinstance(value, int) or value.strip().upper() in _NONE:
        whole = value if isinstance(value, int) else 0
        if whole < 0:
            raise InvalidInput(f"{field}: a count of GPUs is 0 or more, not {whole}")
        return GpuAsk(count=whole)
    parts = _split(value)
    models: tuple[str, ...] = ()
    memory: float | None = None
    count: int | None = None
    for i, part in enumerate(parts):
        token = part.strip()
        if not token:
            continue
        if (m := _MEMORY.match(token)) is not None:
            if memory is not None:
                raise InvalidInput(f"{field}: '{value}' gives the memory twice")
            memory = float(m.group(1))
        elif token.isdigit():
            if count is not None:
                raise InvalidInput(f"{field}: '{value}' gives the count twice")
            count = int(token)
        elif i == 0:
            models = _models(token, field)
        else:
            raise InvalidInput(
                f"{field}: '{token}' in '{value}' is neither a memory (80GB) nor a count (2); "
                "models come first: MODELS:MEMORY:COUNT"
            )
    if count == 0 and (models or memory is not None):
        raise InvalidInput(f"{field}: '{value}' asks for 0 GPUs of a kind; write none")
    return GpuAsk(models=models, memory_gb=memory, count=1 if count is None else count)


def _split(value: str) -> list[str]:
    """`value` at its colons, but not inside a [list]."""
    parts, depth, current = [], 0, ""
    for ch in value:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == ":" and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [*parts, current]


_NVML_NAMES = (  # (pattern on NVML's name, catalog model or a family to pick by memory)
    (r"\bH100\b.*\bNVL\b", "H100-NVL"),
    (r"\bH100\b", "H100"),  # the family: its memory picks H100-80GB
    (r"\bH200\b", "H200"),
    (r"\bB200\b", "B200"),
    (r"\bA100\b", "A100"),
    (r"\bL40S\b", "L40S"),
    (r"\bA40\b", "A40"),
    (r"\bA10G\b", "A10G"),
    (r"\bA10\b", "A10"),
    (r"\bL4\b", "L4"),
    (r"\bT4\b", "T4"),
    (r"\bMI300X\b", "MI300X"),
    (r"\bMI250X?\b", "MI250X"),
)


def canonical_model(nvml_name: str, memory_mib: int | float) -> str | None:
    """The catalog model of an accelerator as NVML names it ("NVIDIA A100-SXM4-80GB", "Tesla
    T4"), its memory telling a family's sizes apart; None for a model the catalog lacks."""
    for pattern, name in _NVML_NAMES:
        if re.search(pattern, nvml_name, re.IGNORECASE):
            sizes = FAMILIES.get(name.upper()) if name.upper() not in MODELS else None
            if not sizes:
                return MODELS[name.upper()].name
            gb = memory_mib / 1024
            return min(sizes, key=lambda m: abs(m.memory_gb - gb)).name
    return None
