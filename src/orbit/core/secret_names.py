"""Which environment variable names hold secrets. ORBIT never freezes their values into a
bundle or the store (DESIGN: job.json carries env "no secret values"), and never shows them."""

from __future__ import annotations

import re

_PARTS = frozenset({"TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "AUTH"})
_SPLIT = re.compile(r"[^A-Za-z0-9]+")


def looks_secret(name: str) -> bool:
    """`HF_TOKEN`, `WANDB_API_KEY`, `AWS_SECRET_ACCESS_KEY`, `DB_PASSWORD`: yes.
    `AUTHOR`, `MONKEY`, `CUDA_VISIBLE_DEVICES`: no."""
    parts = [p.upper() for p in _SPLIT.split(name) if p]
    return any(p in _PARTS for p in parts) or (len(parts) > 1 and parts[-1] == "KEY")
