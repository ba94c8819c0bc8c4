"""Reading a bundle's provenance (inputs/.orbit/provenance.json: the workdir's commit and the
pinned sources, dirty or not). Apart from orbit.core.execution.sources, which writes it, so that
showing a run does not load the staging code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orbit.model.errors import InvalidInput

MANIFEST_DIR = ".orbit"  # inputs/.orbit/: provenance.json and sources/<index>.diff


def read_provenance(bundle_dir: Path) -> dict[str, Any] | None:
    path = bundle_dir / "inputs" / MANIFEST_DIR / "provenance.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: expected a JSON object")
    return data


def is_dirty(provenance: dict[str, Any] | None) -> bool:
    """True when any source, or the workdir, was staged from uncommitted changes."""
    if not provenance:
        return False
    workdir = provenance.get("workdir") or {}
    return any(s.get("dirty") for s in provenance.get("sources", [])) or bool(workdir.get("dirty"))
