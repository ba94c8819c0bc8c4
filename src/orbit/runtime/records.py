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
import time
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


TIMES_RELPATH = "runtime/training.times"  # when the task's log reached which size (LogTimes)
MARK_S = 1.0  # a log that grows gets a mark at most this often


class LogTimes:
    """runtime/training.times, so that `orbit logs --since` finds where to start in a log whose
    lines carry no times of their own (the task's output, as it wrote it): now and then, while
    the log grows, a line "TIME SIZE": at TIME (UTC, ISO 8601) the log held SIZE bytes, so what
    lies past SIZE was written after TIME. Marks are taken at most every MARK_S, and only when
    the size has changed: some 40 bytes a second for a log written without pause."""

    def __init__(self, log: str, times: str) -> None:
        self.log, self.times = log, times
        self.size, self.checked = -1, 0.0

    def mark(self, force: bool = False) -> None:
        """Note the log's size, if it changed (`force`: however soon after the last check)."""
        now_s = time.monotonic()
        if not force and now_s - self.checked < MARK_S:
            return
        self.checked = now_s
        try:
            size = os.stat(self.log).st_size
        except OSError:
            return
        if size == self.size:
            return
        self.size = size
        with contextlib.suppress(OSError):  # a record for reading, never the attempt's end
            with open(self.times, "a", encoding="utf-8", opener=sidecars.nofollow) as f:
                f.write(f"{now()} {size}\n")


def offset_at(times: bytes, since: datetime.datetime) -> int:
    """Where in a log whose runtime/training.times is `times` the bytes written after `since`
    begin (to within MARK_S): the size at the last mark at or before it; 0 where none is."""
    offset = 0
    for line in times.splitlines():
        stamp, _, size = line.decode(errors="replace").partition(" ")
        try:
            at, found = datetime.datetime.fromisoformat(stamp), int(size)
        except ValueError:
            continue  # a line cut short by the host's crash, say
        if at > since:
            break
        offset = found
    return offset


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


def provenance() -> dict[str, Any]:
    """Which run, attempt, bundle and template this is, from what the launch gave the wrapper
    (orbit.core.execution.backends.base.attempt_env); a bundle run by hand is "manual"."""
    env = os.environ
    return {
        "run_id": env.get("ORBIT_RUN_ID") or "manual",
        "attempt_id": env.get("ORBIT_ATTEMPT_ID") or "manual",
        "bundle_digest": env.get("ORBIT_BUNDLE_DIGEST") or None,
        "template": env.get("ORBIT_TEMPLATE") or None,
    }


def handle_facts(bundle: str, host: str) -> dict[str, Any]:
    """Where the attempt ran, as its control plane finds it again: the backend, the target
    it was sent to, this host and folder, and the Slurm job and rank where there are."""
    env = os.environ
    facts = {
        "backend": env.get("ORBIT_BACKEND") or None,
        "target": env.get("ORBIT_TARGET") or None,
        "host": host,
        "location": bundle,
    }
    for key, name in (("slurm_job_id", "SLURM_JOB_ID"), ("node_rank", "ORBIT_NODE_RANK")):
        if env.get(name):
            facts[key] = env[name]
    return facts


def write_manifest(artifacts: str) -> None:
    """artifacts/manifest.json: path, size and sha256 of every plain file under `artifacts`
    (links are left out), written once nothing of the attempt runs any more, and which run,
    attempt, bundle and template they came from (a collected copy is traced without the
    store)."""
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
    manifest = {"schema_version": 1, "run": provenance(), "files": files}
    write_json(os.path.join(artifacts, "manifest.json"), manifest)
