"""The bundle: the frozen directory that is a run's contract, and its digest (the archive it
travels in: bundle_archive.py).

    bundle/
      job.json    the job spec            \
      inputs/     staged data, workdir     > frozen: the digest covers these
      scripts/    the runtime wrapper     /
      runtime/    execution-plane state   \\  live: per attempt, never in the digest
      artifacts/  task outputs            /  nor in the archive that travels
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from orbit.core.execution.docker.scripts import write_docker_scripts
from orbit.model.errors import InvalidInput
from orbit.model.models import JobSpec
from orbit.model.task import StagedPath
from orbit.runtime.vendor import nvml_module_source

FROZEN_PARTS = ("job.json", "inputs", "scripts")
LIVE_PARTS = ("runtime", "artifacts")
# Never staged from a user's folder: caches, environments and VCS internals.
IGNORED_NAMES = frozenset(
    {
        ".git",
        "__pycache__",
        ".venv",
        "venv",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        "orbit-artifacts",
    }  # what `orbit collect` brought back must not ride into the next bundle
)
IGNORE_FILE = ".orbitignore"  # in a staged folder: one glob a line, like .gitignore's simple form
WRAPPER_FILES = {
    "wrapper.py": "orbit_wrapper.py",
    "detach.py": "orbit_detach.py",  # the wrapper's siblings (see orbit.runtime.wrapper)
    "records.py": "orbit_records.py",
    "stopping.py": "orbit_stopping.py",
    "run.sh": "run.sh",
    "precheck.py": "orbit_precheck.py",
    "dist_cache.py": "orbit_dist_cache.py",  # its list of installed packages, kept between runs
    "nvml_audit.py": "orbit_nvml.py",
    "hostside.py": "orbit_hostside.py",  # a Slurm job's probe and its other ranks' copies
    "host_files.py": "orbit_host_files.py",  # hostside's siblings (see orbit.runtime.hostside)
    "host_processes.py": "orbit_host_processes.py",  # the wrapper stops its leftovers with it
    "host_staging.py": "orbit_host_staging.py",
    "sidecars.py": "orbit_sidecars.py",  # the precheck and the NVML audit, run beside the task
    "secret_env.py": "orbit_secret_env.py",  # a run's secrets: read, given, masked out
    "redact.py": "orbit_redact.py",
}
_SMALL_FILE = 1 << 20


@dataclass(frozen=True)
class FrozenBundle:
    digest: str
    path: Path


@dataclass(frozen=True)
class Entry:
    """One frozen path, as the digest and the archive see it."""

    relpath: str  # POSIX, relative to the bundle root
    kind: str  # "d" folder, "f" file, "l" symlink
    executable: bool = False
    link_target: str = ""


# --- digest -----------------------------------------------------------------------------------


def frozen_entries(bundle_dir: Path) -> list[Entry]:
    """Every frozen path in canonical order (bytewise by path), folders included."""
    return [entry for entry, _ in _walk_parts(bundle_dir)]


def _walk_parts(bundle_dir: Path) -> list[tuple[Entry, str]]:
    found: list[tuple[Entry, str]] = []
    root = os.fspath(bundle_dir)
    for part in FROZEN_PARTS:
        path = os.path.join(root, part)
        if part == "job.json" or os.path.exists(path):
            walk_tree(part, path, found)
    return found


def walk_tree(rel: str, path: str, found: list[tuple[Entry, str]]) -> None:
    """`path` and everything under it, as entries named from `rel`, with where each is."""
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        found.append((Entry(rel, "l", link_target=os.readlink(path)), path))
    elif stat.S_ISDIR(mode):
        found.append((Entry(rel, "d"), path))
        with os.scandir(path) as it:
            children = sorted(it, key=lambda e: os.fsencode(e.name))
        for child in children:
            walk_tree(f"{rel}/{child.name}", child.path, found)
    elif stat.S_ISREG(mode):
        found.append((Entry(rel, "f", executable=bool(mode & 0o111)), path))
    else:
        raise InvalidInput(f"{path}: special files cannot be part of a bundle")


def _hash_small(path: str) -> str | None:
    """sha256 of a file's content in one read, or None for a file over _SMALL_FILE."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size > _SMALL_FILE:
            return None
        h = hashlib.sha256(os.read(fd, size))
        while chunk := os.read(fd, _SMALL_FILE):  # a short read, or the file grew
            h.update(chunk)
        return h.hexdigest()
    finally:
        os.close(fd)


def hash_file(path: str | os.PathLike[str]) -> str:
    path = os.fspath(path)
    digest = _hash_small(path)
    if digest is not None:
        return digest
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# a file's hash by what the filesystem says of it (device, inode, size, mtime): the files a
# sweep's bundles share by hard links are read once (see freeze_bundle's `like`)
Memo = dict[tuple[int, int, int, int], str]


def compute_digest(bundle_dir: Path, workers: int = 4, memo: Memo | None = None) -> str:
    """sha256 over (kind, path, executable bit, content hash / link target) of every frozen path.

    Mtimes, owners and permission bits other than "executable" play no part, so the same
    content gives the same digest on every machine. Small files are hashed in this thread:
    their cost is system calls and interpreter work under the GIL, where threads only add
    lock hand-offs (slower, not faster; see bench/bundle.py). Files over _SMALL_FILE go to a
    few threads, since hashlib releases the GIL while it hashes a large buffer. `memo`: the
    hashes of files already read, by inode, taken from it and added to it.
    """
    found = _walk_parts(bundle_dir)
    return digest_of(found, hash_entries(found, workers, memo))


def inputs_digest(folder: Path, memo: Memo | None = None) -> tuple[str, dict[str, str]]:
    """The digest of a bundle's inputs/ alone, as `folder` holds them (the same sha256 as
    compute_digest's, over the entries under inputs/), and {relpath: sha256} of its files.
    A client names the inputs it gathered by it; a server that holds them needs no upload."""
    found: list[tuple[Entry, str]] = []
    walk_tree("inputs", os.fspath(folder), found)
    hashes = hash_entries(found, 4, memo)
    return digest_of(found, hashes), hashes


def hash_entries(found: list[tuple[Entry, str]], workers: int, memo: Memo | None) -> dict[str, str]:
    hashes: dict[str, str] = {}
    large: dict[str, Future[str]] = {}
    with ThreadPoolExecutor(max_workers=workers) as pool:  # starts threads only on submit
        for e, path in found:
            if e.kind == "f":
                known = _known(path, memo)
                digest = memo.get(known) if memo is not None and known is not None else None
                if digest is None:
                    digest = _hash_small(path)
                if digest is None:
                    large[e.relpath] = pool.submit(hash_file, path)
                else:
                    hashes[e.relpath] = digest
        hashes.update((rel, future.result()) for rel, future in large.items())
    if memo is not None:
        for e, path in found:
            if e.kind == "f":
                known = _known(path, memo)
                if known is not None:
                    memo[known] = hashes[e.relpath]
    return hashes


def digest_of(found: list[tuple[Entry, str]], hashes: dict[str, str]) -> str:
    outer = hashlib.sha256()
    for e, _ in found:
        detail = (
            hashes[e.relpath] + (":x" if e.executable else ":-") if e.kind == "f" else e.link_target
        )
        outer.update(b"\0".join((e.kind.encode(), os.fsencode(e.relpath), os.fsencode(detail))))
        outer.update(b"\n")
    return outer.hexdigest()


def forget(memo: Memo | None, path: Path) -> None:
    """`path`'s files out of `memo`, before they are removed: a file made later may take
    the same inode (and a client chose the mtime of what it sent)."""
    if memo is None or not path.exists() or path.is_symlink():
        return
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for file in files:
        known = _known(os.fspath(file), memo)
        if known is not None:
            memo.pop(known, None)


def _known(path: str, memo: Memo | None) -> tuple[int, int, int, int] | None:
    if memo is None:
        return None
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


# --- freeze -----------------------------------------------------------------------------------


def canonical_json(job: JobSpec) -> str:
    return json.dumps(job.model_dump(mode="json"), sort_keys=True, indent=2) + "\n"


def _copy_file(src: Path, dest: Path) -> None:
    shutil.copyfile(src, dest, follow_symlinks=False)
    executable = bool(src.stat().st_mode & 0o111)
    os.chmod(dest, 0o755 if executable else 0o644)


def read_ignore_file(root: Path) -> tuple[str, ...]:
    """Patterns from `root/.orbitignore`: blank lines and `#` comments skipped."""
    try:
        lines = (root / IGNORE_FILE).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return ()
    return tuple(
        line.strip().strip("/") for line in lines if line.strip() and not line.startswith("#")
    )


def _ignored(root: Path, path: Path, patterns: tuple[str, ...]) -> bool:
    if path.name in IGNORED_NAMES or path.name.endswith(".pyc"):
        return True
    rel = path.relative_to(root).as_posix()
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(path.name, p) for p in patterns)


def _copy_tree(root: Path, src: Path, dest: Path, patterns: tuple[str, ...] = ()) -> None:
    """Copy a staged folder; links must stay inside it, special files are refused, and what
    IGNORED_NAMES or the folder's .orbitignore names is left out."""
    dest.mkdir(parents=True, exist_ok=True)
    with os.scandir(src) as it:
        children = list(it)
    for child in children:
        if _ignored(root, Path(child.path), patterns):
            continue
        path = Path(child.path)
        if child.is_symlink():
            target = os.readlink(path)
            resolved = (path.parent / target).resolve()
            if os.path.isabs(target) or not resolved.is_relative_to(root):
                raise InvalidInput(
                    f"{path}: symlink points outside the staged folder ({target}); "
                    "copy the file in or stage the folder it points into"
                )
            os.symlink(target, dest / child.name)
        elif child.is_dir(follow_symlinks=False):
            _copy_tree(root, path, dest / child.name, patterns)
        elif child.is_file(follow_symlinks=False):
            _copy_file(path, dest / child.name)
        else:
            raise InvalidInput(f"{path}: special files (sockets, fifos, devices) cannot be staged")


def stage_inputs(inputs_dir: Path, staged: Iterable[StagedPath]) -> None:
    for item in staged:
        dest = inputs_dir / item.dest
        if item.source.is_dir():
            root = item.source.resolve()
            _copy_tree(root, root, dest, read_ignore_file(root))
        elif item.source.is_file():
            dest.parent.mkdir(parents=True, exist_ok=True)
            _copy_file(item.source, dest)
        else:
            raise InvalidInput(f"{item.source}: no such file or folder to stage")


def write_scripts(scripts_dir: Path, job: JobSpec | None = None) -> None:
    """The wrapper and its sidecars; with a docker launch mode, its generated launch scripts."""
    scripts_dir.mkdir(parents=True, exist_ok=True)
    package = resources.files("orbit.runtime")
    for name, dest_name in WRAPPER_FILES.items():
        dest = scripts_dir / dest_name
        dest.write_bytes((package / name).read_bytes())
        os.chmod(dest, 0o755)
    pynvml = nvml_module_source()  # nvidia-ml-py's one-file binding, so the audit needs no pip
    if pynvml is not None:
        (scripts_dir / "pynvml.py").write_bytes(pynvml)
        os.chmod(scripts_dir / "pynvml.py", 0o644)
    if job is not None and job.launch_mode.kind == "docker":
        write_docker_scripts(scripts_dir, job)


def freeze_bundle(
    job: JobSpec,
    staged: Iterable[StagedPath],
    cache_root: Path,
    add_inputs: Callable[[Path], None] | None = None,
    memo: Memo | None = None,
) -> FrozenBundle:
    """Build the bundle in a scratch folder, digest it, and move it into the per-digest cache.

    `add_inputs(inputs_dir)` may place more (pinned sources, provenance) before the digest.
    The same job and inputs give the same digest and so the same cached folder. On any error
    the scratch folder is removed: nothing half-written is left behind. `memo`: hashes known
    by inode (see compute_digest). Inputs already on this disk: bundle_link.freeze_linked.
    """
    cache_root.mkdir(parents=True, exist_ok=True)
    scratch = cache_root / f".tmp-{uuid.uuid4().hex}"
    try:
        scratch.mkdir()
        (scratch / "job.json").write_text(canonical_json(job), encoding="utf-8")
        inputs = scratch / "inputs"
        inputs.mkdir()
        stage_inputs(inputs, staged)
        (inputs / job.workdir).mkdir(parents=True, exist_ok=True)
        if add_inputs is not None:
            add_inputs(inputs)
        write_scripts(scratch / "scripts", job)
        digest = compute_digest(scratch, memo=memo)
        final = cache_root / digest
        try:
            scratch.rename(final)
        except OSError:
            if not (final / "job.json").is_file():
                raise
            shutil.rmtree(scratch)  # the same content is cached already
        return FrozenBundle(digest=digest, path=final)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def load_job(bundle_dir: Path) -> JobSpec:
    return JobSpec.model_validate_json((bundle_dir / "job.json").read_text(encoding="utf-8"))


class BundleChanged(Exception):
    """A cached bundle whose files no longer give its digest (see `copy_frozen`)."""

    def __init__(self, digest: str, why: str, where: str) -> None:
        from orbit.runtime.host_staging import changed_message

        super().__init__(changed_message(digest, why, where))


def copy_frozen(
    bundle: FrozenBundle, dest: Path, pycache: bool = False, where: str = "this machine's"
) -> dict[str, str]:
    """An attempt's own copy of the frozen parts, checked against the bundle's digest as it
    is made (BundleChanged, and no copy, when the cached bundle no longer gives it), with
    fresh, empty runtime/ and artifacts/. {relpath: sha256} of its files."""
    from orbit.runtime.host_staging import Changed, copy_verified

    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        files = copy_verified(str(bundle.path), str(dest), bundle.digest, pycache)
    except Changed as exc:
        raise BundleChanged(bundle.digest, str(exc), where) from None
    for part in LIVE_PARTS:
        (dest / part).mkdir()
    return files
