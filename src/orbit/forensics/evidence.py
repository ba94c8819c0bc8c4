"""What a run left behind, gathered once from wherever it ran, for `inspect` and `diff`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from orbit.model.records import AttemptRecord, RunRecord

# which container image an attempt ran (docker launch mode), written by the wrapper before the
# container started
IMAGE_FILE = "runtime/image.json"
WHOLE_FILES = (
    "job.json",
    "runtime/status.json",
    "runtime/result.json",
    "runtime/runtime.log",
    "runtime/precheck.json",
    IMAGE_FILE,
    "inputs/.orbit/provenance.json",
)
TAILS = {
    "artifacts/training.log": 16 * 1024,
    "artifacts/**/logging.jsonl": 1 << 20,
    "artifacts/nvml-audit.jsonl": 1 << 20,
}


@dataclass(frozen=True)
class Evidence:
    run: RunRecord
    attempt: AttemptRecord
    files: dict[str, bytes] = field(default_factory=dict)  # relpath -> content, if present
    tails: dict[str, bytes] = field(default_factory=dict)  # relpath -> last bytes

    def json(self, relpath: str) -> dict[str, Any] | None:
        raw = self.files.get(relpath)
        if raw is None:
            return None
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def text(self, relpath: str) -> str:
        raw = self.files.get(relpath, self.tails.get(relpath, b""))
        return raw.decode("utf-8", errors="replace")

    def matching(self, suffix: str) -> dict[str, bytes]:
        return {k: v for k, v in self.tails.items() if k.endswith(suffix)}
