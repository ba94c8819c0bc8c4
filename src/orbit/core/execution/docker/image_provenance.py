"""Which container image an attempt actually ran: runtime/image.json, written by the wrapper
before the container started (scripts/orbit_docker.py). Read back from wherever the attempt
ran, for `orbit runs show`; `orbit diff` reads it through the evidence like every other file."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orbit.core.errors import OrbitError
from orbit.core.execution.runtime_state import parse_json
from orbit.core.records import RunRecord

if TYPE_CHECKING:  # the pure readers (inspect) import this module without the backends
    from orbit.core.execution.service import ExecutionService

IMAGE_FILE = "runtime/image.json"


def attempt_images(execution: ExecutionService, run: RunRecord) -> dict[str, dict[str, Any]]:
    """attempt id -> its image record, for the attempts that ran in a container and got as far
    as finding their image. A host that cannot be read now leaves its attempts out."""
    found: dict[str, dict[str, Any]] = {}
    for attempt in run.attempts:
        if attempt.handle is None or not attempt.backend_key.endswith("_docker"):
            continue
        try:
            raw = execution.backend(attempt.backend_key).read_file(attempt.handle, IMAGE_FILE)
        except OrbitError:  # no backend here, or its host is unreachable
            continue
        record = parse_json(raw)
        if record is not None:
            found[attempt.id] = record
    return found


def image_line(image: dict[str, Any] | None) -> str | None:
    """`ref @ sha256:0123456789ab` (with the registry digest when the image has one)."""
    if not image:
        return None
    line = f"{image.get('ref')} @ {str(image.get('id'))[:19]}"
    digests = image.get("repo_digests") or []
    if digests:
        line += f" ({digests[0]})"
    return line
