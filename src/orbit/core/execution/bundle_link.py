"""Freezing a bundle from inputs already on this disk (what a client sent, held or unpacked;
a sweep's points): the digest is counted before anything is written, from job.json's text,
the inputs' files (hashed once: see Memo) and the wrapper's files, which are written once per
cache and ORBIT version into a folder of their own and linked from there. A bundle the cache
holds already is returned as it is; another is made of links and job.json and renamed into
place. The digest and the folder are exactly freeze_bundle's for the same job and inputs."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import threading
import uuid
from pathlib import Path

from orbit.core.execution.bundle import (
    Entry,
    FrozenBundle,
    Memo,
    canonical_json,
    digest_of,
    freeze_bundle,
    hash_entries,
    walk_tree,
    write_scripts,
)
from orbit.model.models import JobSpec

_lock = threading.Lock()
_scripts: dict[Path, tuple[Path, Memo]] = {}  # cache -> its wrapper folder, its files' hashes


def freeze_linked(job: JobSpec, inputs: Path, cache_root: Path, memo: Memo) -> FrozenBundle:
    """The bundle of `job` over the files of `inputs` (a folder of this machine's, which
    gains the job's workdir if it lacks it), linked, not copied, where the disk allows.
    `memo`: hashes known by inode, used and added to. A docker launch mode's scripts are the
    job's own: freeze_bundle makes those."""
    if job.launch_mode.kind == "docker":
        return freeze_bundle(
            job, (), cache_root, lambda folder: link_tree(inputs, folder), memo=memo
        )
    cache_root.mkdir(parents=True, exist_ok=True)
    (inputs / job.workdir).mkdir(parents=True, exist_ok=True)
    scripts = _wrapper_folder(cache_root, memo)
    text = canonical_json(job).encode()
    found: list[tuple[Entry, str]] = [(Entry("job.json", "f"), "")]
    walk_tree("inputs", os.fspath(inputs), found)
    walk_tree("scripts", os.fspath(scripts), found)
    hashes = hash_entries(found[1:], 4, memo)
    hashes["job.json"] = hashlib.sha256(text).hexdigest()
    digest = digest_of(found, hashes)
    final = cache_root / digest
    if (final / "job.json").is_file():
        return FrozenBundle(digest=digest, path=final)  # the same content is cached already
    scratch = cache_root / f".tmp-{uuid.uuid4().hex}"
    try:
        scratch.mkdir()
        (scratch / "job.json").write_bytes(text)
        link_tree(inputs, scratch / "inputs")
        link_tree(scripts, scratch / "scripts")
        try:
            scratch.rename(final)
        except OSError:
            if not (final / "job.json").is_file():
                raise
            shutil.rmtree(scratch)  # made meanwhile by another submit
        return FrozenBundle(digest=digest, path=final)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def _wrapper_folder(cache_root: Path, memo: Memo) -> Path:
    """The wrapper's files (write_scripts) in `cache_root/.scripts-DIGEST/`, written once
    (their digest names the folder, so an upgrade writes another); their hashes join `memo`."""
    with _lock:
        known = _scripts.get(cache_root)
        if known is None or not known[0].is_dir():
            for gone in [root for root, (folder, _) in _scripts.items() if not folder.is_dir()]:
                del _scripts[gone]  # a dry run's scratch cache, say
            known = _write_wrapper(cache_root)
            _scripts[cache_root] = known
    memo.update(known[1])
    return known[0]


def _write_wrapper(cache_root: Path) -> tuple[Path, Memo]:
    tmp = cache_root / f".tmp-scripts-{uuid.uuid4().hex}"
    try:
        write_scripts(tmp)
        found: list[tuple[Entry, str]] = []
        walk_tree("scripts", os.fspath(tmp), found)
        memo: Memo = {}
        folder = cache_root / f".scripts-{digest_of(found, hash_entries(found, 1, memo))}"
        try:
            tmp.rename(folder)
        except OSError:
            if not folder.is_dir():
                raise
            memo = {}  # another process wrote the same files: theirs are hashed
            found = []
            walk_tree("scripts", os.fspath(folder), found)
            hash_entries(found, 1, memo)
        return folder, memo
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def link_tree(source: Path, dest: Path) -> None:
    """`source`'s files hard-linked at `dest` (which may exist) where the filesystem allows,
    else copied; its links made again as links. Nothing writes a frozen file in place (a
    file restaged is unlinked first), so the bundles and folders sharing them cannot change
    each other."""
    os.makedirs(dest, exist_ok=True)
    _link_folder(os.fspath(source), os.fspath(dest))


def _link_folder(source: str, dest: str) -> None:
    with os.scandir(source) as it:
        for entry in it:
            out = os.path.join(dest, entry.name)
            if entry.is_symlink():
                os.symlink(os.readlink(entry.path), out)
            elif entry.is_dir():
                with contextlib.suppress(FileExistsError):
                    os.mkdir(out)
                _link_folder(entry.path, out)
            else:
                try:
                    os.link(entry.path, out)
                except FileExistsError:
                    raise  # never written over: it may be another bundle's file
                except OSError:  # another disk, too many links: a copy
                    shutil.copy2(entry.path, out, follow_symlinks=False)
