"""Checking collected artifacts against the manifest the wrapper wrote."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from orbit.model.records import CollectResult

__all__ = ["CollectResult", "copy_artifacts", "sha256_file", "verify_manifest"]

STATE_DIR = ".orbit-collect"  # a collect's own state at its destination (orbit.client.collect)


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def copy_artifacts(
    source: Path, dest: Path, skip: Callable[[Path], bool] | None = None
) -> CollectResult:
    """Copy an attempt's artifacts/ folder on this machine into `dest` (links and what `skip`
    names left out) and check the copy against its manifest. Incremental: a file `dest`
    already has with the same size and modification time (the copy keeps it) is not copied
    again, as rsync's quick check; the manifest check reads every file anyway."""
    dest.mkdir(parents=True, exist_ok=True)
    files = size = moved = 0
    for path in sorted(source.rglob("*")):
        if path.is_symlink() or not path.is_file() or (skip is not None and skip(path)):
            continue
        target = dest / path.relative_to(source)
        have = path.stat()
        files += 1
        size += have.st_size
        if _same(target, have):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        moved += have.st_size
    found, problems = verify_manifest(dest)
    return CollectResult(
        dest=dest,
        files=files,
        bytes=size,
        moved=moved,
        verified=found and not problems,
        problems=tuple(problems),
    )


def _same(target: Path, source: os.stat_result) -> bool:
    try:
        there = target.stat()
    except OSError:
        return False
    return there.st_size == source.st_size and there.st_mtime_ns == source.st_mtime_ns


def verify_manifest(
    artifacts_dir: Path,
    digests: Mapping[str, str] | None = None,
    *,
    ignore: Collection[str] = (),
    removed: Collection[str] = (),
) -> tuple[bool, list[str]]:
    """(manifest found, problems): every file listed must exist with its size and sha256.
    `digests` are sha256s already taken of files since written (while a transfer went on).
    `ignore`: top-level names that are not the attempt's (a collect's own state, a gang's
    other ranks under nodes/); `removed`: paths retention or gc removed, whose absence is no
    problem (the caller says so)."""
    digests = digests or {}
    manifest_path = artifacts_dir / "manifest.json"
    if not manifest_path.is_file():
        return False, []
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        entries = manifest["files"]
    except (ValueError, KeyError, TypeError):
        return True, ["manifest.json is not a valid manifest"]
    problems = []
    for entry in entries:
        path = artifacts_dir / entry["path"]
        if not path.is_file():
            if not _under(entry["path"], removed):
                problems.append(f"{entry['path']}: missing")
        elif path.stat().st_size != entry["size"]:
            problems.append(
                f"{entry['path']}: size {path.stat().st_size}, expected {entry['size']}"
            )
        elif digests.get(entry["path"]) != entry["sha256"] and sha256_file(path) != entry["sha256"]:
            # (a digest taken during the transfer that differs is taken again from the disk)
            problems.append(f"{entry['path']}: sha256 differs from the manifest")
    listed = {entry["path"] for entry in entries} | {"manifest.json"}
    for path in sorted(artifacts_dir.rglob("*")):
        rel = path.relative_to(artifacts_dir).as_posix()
        if rel.split("/", 1)[0] in (STATE_DIR, *ignore):
            continue
        if path.is_file() and rel not in listed:
            problems.append(f"{rel}: not in the manifest (left from another attempt or run?)")
    return True, problems


def _under(path: str, prefixes: Collection[str]) -> bool:
    return any(path == p or path.startswith(f"{p}/") for p in prefixes)
