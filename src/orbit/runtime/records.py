"""What the runtime wrapper writes for ORBIT to read: runtime/status.json, result.json and
stop_request.json as JSON written whole under another name, then renamed into place, and
artifacts/manifest.json (path, size and sha256 of every artifact). Never through a link left
where it writes (a container's root may write both folders). It travels inside the bundle
beside the wrapper (scripts/orbit_records.py) and needs nothing but python3's standard library.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # as mypy reads it
    from orbit.runtime import sidecars
else:
    try:  # in a bundle: beside this file in scripts/
        import orbit_sidecars as sidecars
    except ImportError:  # as part of the orbit package
        from orbit.runtime import sidecars


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def write_json(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # whatever was left under that name (by a container's root, say)
    with open(tmp, "x", encoding="utf-8", opener=sidecars.nofollow) as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_manifest(artifacts: str) -> None:
    """artifacts/manifest.json: path, size and sha256 of every plain file under `artifacts`
    (links are left out), written once nothing of the attempt runs any more."""
    import hashlib  # here: not in the way of every attempt's start

    files = []
    for root, dirs, names in os.walk(artifacts):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, artifacts).replace(os.sep, "/")
            if rel == "manifest.json" or os.path.islink(path) or not os.path.isfile(path):
                continue
            digest = hashlib.sha256()
            with open(path, "rb", opener=sidecars.nofollow) as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
            files.append({"path": rel, "size": os.path.getsize(path), "sha256": digest.hexdigest()})
    write_json(os.path.join(artifacts, "manifest.json"), {"schema_version": 1, "files": files})
