"""Checking collected artifacts against the manifest the wrapper wrote."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from orbit.core.records import CollectResult

__all__ = ["CollectResult", "copy_artifacts", "sha256_file", "verify_manifest"]


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def copy_artifacts(
    source: Path, dest: Path, skip: Callable[[Path], bool] | None = None
) -> CollectResult:
    """Copy an attempt's artifacts/ folder on this machine into `dest` (links and what `skip`
    names left out) and check the copy against its manifest."""
    dest.mkdir(parents=True, exist_ok=True)
    files = size = 0
    for path in sorted(source.rglob("*")):
        if path.is_symlink() or not path.is_file() or (skip is not None and skip(path)):
            continue
        target = dest / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        files += 1
        size += path.stat().st_size
    found, problems = verify_manifest(dest)
    return CollectResult(
        dest=dest,
        files=files,
        bytes=size,
        verified=found and not problems,
        problems=tuple(problems),
    )


def verify_manifest(
    artifacts_dir: Path, digests: Mapping[str, str] | None = None
) -> tuple[bool, list[str]]:
    """(manifest found, problems): every file listed must exist with its size and sha256.
    `digests` are sha256s already taken of files since written (while a transfer went on)."""
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
        if path.is_file() and rel not in listed:
            problems.append(f"{rel}: not in the manifest (left from another attempt or run?)")
    return True, problems
