"""Upstream sources pinned to an exact commit, and the thin provenance manifest of a bundle.

A task may declare git sources `{repo, ref, path}`: the commit's tree is exported byte for byte
and staged at inputs/<path>. The manifest, inputs/.orbit/provenance.json, sits beside the
staged trees and never inside them: ORBIT does not write into an upstream's folder.

Git runs as `git -C <folder> ...` in a subprocess. No `safe.directory` override is passed: a
checkout owned by another user is refused with git's reason, since overriding it would let that
user's repository configuration run commands as us.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orbit.core.execution import git_mirrors
from orbit.core.execution.provenance import MANIFEST_DIR as MANIFEST_DIR
from orbit.core.execution.provenance import is_dirty as is_dirty
from orbit.core.execution.provenance import read_provenance as read_provenance
from orbit.model.errors import InvalidInput, OrbitError, describe_validation_error

SCHEMA_VERSION = 1
RESERVED_DESTS = ("workdir", MANIFEST_DIR)
_COMMIT = re.compile(r"^[0-9a-fA-F]{40}$")
# Inherited from a git hook, these would point our git calls at some other repository.
_GIT_ENV_DROP = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
                 "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_COMMON_DIR", "GIT_NAMESPACE")  # fmt: skip


class SourceSpec(BaseModel):
    """One entry of `task.sources`. `ref` is normalised to lower case."""

    model_config = ConfigDict(extra="forbid")

    repo: str = Field(
        min_length=1,
        description="a git checkout (absolute, or relative to the spec) or a URL to mirror",
    )
    ref: str = Field(description="the exact 40-character commit to stage")
    path: str = Field(description="where to stage the commit's tree, relative to inputs/")

    @field_validator("ref")
    @classmethod
    def _exact_commit(cls, value: str) -> str:
        if not _COMMIT.match(value):
            raise ValueError(f"ref must be an exact 40-character commit hash, not {value!r}")
        return value.lower()

    @field_validator("path")
    @classmethod
    def _inside_inputs(cls, value: str) -> str:
        pure = PurePosixPath(value)
        if pure.is_absolute() or "\\" in value:
            raise ValueError(f"path must be a relative POSIX path inside inputs/, not {value!r}")
        if ".." in pure.parts:
            raise ValueError(f"path must not contain '..': {value!r}")
        if not pure.parts:
            raise ValueError(f"path must name a folder inside inputs/, not {value!r}")
        if pure.parts[0] in RESERVED_DESTS:
            raise ValueError(f"path {value!r} is reserved: inputs/{pure.parts[0]} is ORBIT's")
        return pure.as_posix()


def parse_sources(raw: list[dict[str, Any]], reserved: Iterable[str] = ()) -> list[SourceSpec]:
    """Validate `task.sources`; no two paths (nor a path and a `reserved` dest) may overlap."""
    specs: list[SourceSpec] = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            raise InvalidInput(f"task.sources.{index}: expected a mapping {{repo, ref, path}}")
        try:
            specs.append(SourceSpec.model_validate(item))
        except ValidationError as exc:  # "-: ref: ..." -> "task.sources.0.ref: ..."
            field_and_message = describe_validation_error("-", exc, SourceSpec).removeprefix("-: ")
            raise InvalidInput(f"task.sources.{index}.{field_and_message}") from None
    taken = [(f"inputs/{dest}", PurePosixPath(dest)) for dest in reserved]
    for index, spec in enumerate(specs):
        mine = PurePosixPath(spec.path)
        for owner, other in taken:
            if mine.is_relative_to(other) or other.is_relative_to(mine):
                raise InvalidInput(f"task.sources.{index}.path: {spec.path!r} overlaps {owner}")
        taken.append((f"task.sources.{index}.path", mine))
    return specs


@dataclass(frozen=True)
class StagedSource:
    index: int  # the position in task.sources: names the fields in errors and the diff file
    dest: str  # == spec.path, relative to inputs/
    tree_dir: Path  # the exported tree, under the caller's scratch folder
    provenance: dict[str, Any]
    diff: bytes | None  # the uncommitted changes applied on top (--allow-dirty), if any


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _GIT_ENV_DROP}
    return {**env, "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C", **extra}


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        cmd = ["git", "-C", str(cwd), *args]
        return subprocess.run(cmd, capture_output=True, env=_env(), check=False)
    except FileNotFoundError:
        raise InvalidInput("git is not installed: it is needed for git sources") from None


def _checked(cwd: Path, *args: str, where: str) -> bytes:
    done = _git(cwd, *args)
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["(no message)"]
        raise InvalidInput(f"{where}: git {args[0]} failed in {cwd}: {why[0]}")
    return done.stdout


def _toplevel(folder: Path) -> tuple[Path | None, str]:
    done = _git(folder, "rev-parse", "--show-toplevel")
    if done.returncode != 0:
        return None, done.stderr.decode(errors="replace")
    return Path(os.fsdecode(done.stdout.rstrip(b"\n"))).resolve(), ""


def _origin_url(top: Path) -> str | None:
    """remote.origin.url without any user or token in it."""
    url = _git(top, "config", "--get", "remote.origin.url").stdout.decode().strip()
    return git_mirrors.shown(url) if url else None


def _status(top: Path, where: str) -> tuple[list[str], list[str]]:
    """(changed tracked paths, untracked paths), relative to the repository's top."""
    out = _checked(top, "status", "--porcelain=v1", "-z", "--untracked-files=normal", where=where)
    records = iter(out.split(b"\0"))
    changed: list[str] = []
    untracked: list[str] = []
    for record in records:
        if not record:
            continue
        code, path = record[:2], os.fsdecode(record[3:])
        (untracked if code == b"??" else changed).append(path)
        if code[:1] in (b"R", b"C"):
            next(records, None)  # with -z a rename's old path is the next field
    return sorted(changed), sorted(untracked)


def _some(paths: list[str], limit: int = 10) -> str:
    more = f", and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(paths[:limit]) + more


def _checkout(spec: SourceSpec, base_dir: Path, where: str) -> Path:
    path = (base_dir / Path(spec.repo).expanduser()).resolve()
    if not path.exists():
        raise InvalidInput(f"{where}: {path} does not exist")
    if not path.is_dir():
        raise InvalidInput(f"{where}: {path} is not a folder")
    top, why = _toplevel(path)
    if top is None:
        if "dubious ownership" in why:
            raise InvalidInput(f"{where}: git refuses {path}: it is owned by another user")
        bare = " (a bare repository has no checkout)" if "work tree" in why else ""
        raise InvalidInput(f"{where}: {path} is not a git repository{bare}")
    if top != path:
        raise InvalidInput(f"{where}: {path} is inside the git repository {top}; name its top")
    return top


def _export_tree(top: Path, commit: str, dest: Path, where: str) -> list[str]:
    """Write the commit's tree under `dest` byte for byte; return the submodules' paths.

    Not `git archive`: it applies export-ignore, export-subst and filters from .gitattributes,
    and the files would no longer be the commit's. Submodules have no content in this
    repository: their folders are left empty. Links are made last, so no file is written
    through one.
    """
    listing = _checked(top, "ls-tree", "-r", "-z", "--full-tree", commit, where=where).split(b"\0")
    blobs: list[tuple[str, str, str]] = []
    submodules: list[str] = []
    for record in filter(None, listing):
        meta, _, raw = record.partition(b"\t")
        mode, _, sha = meta.decode().split(" ")
        rel = os.fsdecode(raw)
        parts = PurePosixPath(rel).parts
        if rel.startswith("/") or ".." in parts or ".git" in map(str.lower, parts):
            raise InvalidInput(f"{where}: commit {commit} holds an unsafe path {rel!r}")
        if mode == "160000":
            submodules.append(rel)
            (dest / rel).mkdir(parents=True, exist_ok=True)
        else:
            blobs.append((mode, sha, rel))
    blobs.sort(key=lambda blob: blob[0] == "120000")  # links last
    cmd = ["git", "-C", str(top), "cat-file", "--batch"]
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_env()) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        for mode, sha, rel in blobs:
            proc.stdin.write(f"{sha}\n".encode())
            proc.stdin.flush()  # cat-file flushes each object: one at a time, no deadlock
            size = int(proc.stdout.readline().split()[2])
            content = proc.stdout.read(size + 1)[:-1]  # the object, then a newline
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if mode != "120000":
                with open(target, "xb") as f:
                    f.write(content)
                os.chmod(target, 0o755 if mode == "100755" else 0o644)
                continue
            link = os.fsdecode(content)
            inside = os.path.normpath(os.path.join(os.path.dirname(rel), link))
            if os.path.isabs(link) or inside == ".." or inside.startswith("../"):
                raise InvalidInput(f"{where}: {rel} in {commit} links outside it ({link})")
            try:
                os.symlink(link, target)
            except FileExistsError:
                raise InvalidInput(f"{where}: commit {commit} holds {rel!r} twice") from None
        proc.stdin.close()
    return submodules


def stage_source(
    spec: SourceSpec,
    index: int,
    base_dir: Path,
    scratch: Path,
    allow_dirty: bool,
    upstream: str | None = None,
) -> StagedSource:
    """Export `spec.ref`'s tree to `scratch/source-<index>`; refuse a dirty checkout unless
    `allow_dirty`, which applies the tracked changes (`git diff <ref>`, so commit + diff is
    exactly what is staged) and records them. Untracked files are never staged. An
    `upstream` (the field that names it, as task.upstream) is never staged dirty."""
    field = upstream or f"task.sources.{index}"
    ref = f"{field}.commit" if upstream else f"{field}.ref"
    commit = spec.ref
    url = git_mirrors.is_url(spec.repo)
    if url:  # a bare mirror of ORBIT's own: nothing in it is uncommitted
        top = git_mirrors.mirror(spec.repo, commit, f"{field}.repo")
    else:
        top = _checkout(spec, base_dir, f"{field}.repo")
    where = git_mirrors.shown(spec.repo) if url else str(top)
    kind = _git(top, "cat-file", "-t", commit)
    if kind.returncode != 0:
        raise InvalidInput(f"{ref}: commit {commit} not found in {where}")
    if kind.stdout.strip() != b"commit":
        raise InvalidInput(f"{ref}: {commit} is a {kind.stdout.decode().strip()}, not a commit")
    changed, untracked = ([], []) if url else _status(top, f"{field}.repo")
    dirty_paths = sorted(changed + untracked)
    if dirty_paths and (upstream or not allow_dirty):
        what = (
            "an upstream runs exactly as committed (--allow-dirty does not apply to it)"
            if upstream
            else "or pass --allow-dirty to record the diff in the bundle"
        )
        raise InvalidInput(
            f"{field}.repo: {top} has uncommitted changes ({_some(dirty_paths)}); commit "
            f"them, {what}"
        )
    tree_dir = scratch / f"source-{index}"
    tree_dir.mkdir(parents=True)
    submodules = _export_tree(top, commit, tree_dir, ref)
    diff: bytes | None = None
    if changed:
        args = ("--binary", "--no-color", "--no-ext-diff", "--src-prefix=a/", "--dst-prefix=b/")
        diff = _git(top, "diff", *args, "--ignore-submodules=all", commit, "--").stdout or None
    if diff:
        # git must not find a repository above the exported tree and apply the diff there
        env = _env(GIT_CEILING_DIRECTORIES=str(tree_dir.resolve().parent))
        cmd = ["git", "apply", "--whitespace=nowarn", "-"]
        applied = subprocess.run(cmd, input=diff, cwd=tree_dir, env=env, capture_output=True)
        if applied.returncode != 0:
            why = applied.stderr.decode(errors="replace").strip()
            raise InvalidInput(
                f"{field}.repo: the changes in {top} do not apply to {commit}: {why}"
            )
    origin = git_mirrors.shown(spec.repo) if url else _origin_url(top)
    tree = _checked(top, "rev-parse", f"{commit}^{{tree}}", where=ref)
    provenance: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": "git",
        **({"upstream": upstream} if upstream else {}),
        "repo": origin or str(top),
        "repo_path": str(top),
        "origin_url": origin,
        "commit": commit,
        "tree": tree.decode().strip(),
        "path": spec.path,
        "dirty": bool(dirty_paths),
        "diff_sha256": hashlib.sha256(diff).hexdigest() if diff else None,
        "dirty_paths": dirty_paths,
        "untracked_not_staged": untracked,
        "submodules_not_staged": submodules,
    }
    return StagedSource(index, spec.path, tree_dir, provenance, diff)


def place_sources(inputs_dir: Path, sources: Iterable[StagedSource]) -> None:
    """Move each exported tree to inputs/<dest> as it is (no files skipped, nothing rewritten)."""
    for source in sources:
        target = inputs_dir / source.dest
        if target.exists() or target.is_symlink():
            raise InvalidInput(f"task.sources.{source.index}.path: inputs/{source.dest} is taken")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(source.tree_dir, target)


def snapshot_workdir(folder: Path) -> dict[str, Any] | None:
    """The git state of a submitted workdir, or None outside a work tree. Never refuses: the
    workdir is copied in full. `dirty_paths` covers the whole repository, from its top."""
    try:
        top, _ = _toplevel(folder)
        if top is None:
            return None
        head = _git(top, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
        changed, untracked = _status(top, "workdir")
    except OrbitError:
        return None
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "git",
        "repo_path": str(top),
        "origin_url": _origin_url(top),
        "commit": head.stdout.decode().strip() if head.returncode == 0 else None,
        "dirty": bool(changed or untracked),
        "dirty_paths": sorted(changed + untracked),
        "dirty_paths_scope": "repository",
        "subdir": folder.resolve().relative_to(top).as_posix(),
    }


def write_provenance(
    inputs_dir: Path, sources: list[StagedSource], workdir: dict[str, Any] | None
) -> None:
    """inputs/.orbit/provenance.json, and sources/<index>.diff for each dirty source."""
    if not sources and workdir is None:
        return  # nothing to record: the bundle stays as it was before sources existed
    manifest_dir = inputs_dir / MANIFEST_DIR
    manifest_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for source in sources:
        record = dict(source.provenance)
        if source.diff:
            rel = f"sources/{source.index}.diff"
            (manifest_dir / "sources").mkdir(exist_ok=True)
            (manifest_dir / rel).write_bytes(source.diff)
            record["diff_file"] = f"{MANIFEST_DIR}/{rel}"
        records.append(record)
    manifest = {"schema_version": SCHEMA_VERSION, "sources": records, "workdir": workdir}
    text = json.dumps(manifest, sort_keys=True, indent=2) + "\n"
    (manifest_dir / "provenance.json").write_text(text, encoding="utf-8")
