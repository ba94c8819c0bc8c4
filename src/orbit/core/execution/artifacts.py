"""Checking collected artifacts against the manifest the wrapper wrote."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

from orbit.core.records import CollectResult

__all__ = ["CollectResult", "sha256_file", "verify_manifest"]


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


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
