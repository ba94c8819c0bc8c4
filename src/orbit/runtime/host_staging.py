"""Bundles staged on a host, and the verified copies attempts run in.

Under the host's work dir:
  bundles/DIGEST/         frozen bundles, one per digest (complete when .orbit-complete exists)
  bundles/.partial-DIGEST/  a transfer in progress; a later push continues it
  attempts/ATTEMPT_ID/    one attempt's copy of the bundle, with its own runtime/ and artifacts/

An attempt's copy is checked against the bundle's digest as it is made, so that it runs the
bytes that were frozen. Standard library only: it travels beside hostside
(scripts/orbit_host_staging.py; see orbit.runtime.hostside).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
from typing import Any

COMPLETE = ".orbit-complete"
FROZEN_PARTS = ("job.json", "inputs", "scripts")


def stage_check(work: str, digest: str) -> dict[str, Any]:
    """Make the work dir's layout; whether the bundle is already complete there."""
    work = os.path.abspath(os.path.expanduser(work))
    for part in ("bundles", "attempts"):
        os.makedirs(os.path.join(work, part), exist_ok=True)
    cached = os.path.exists(os.path.join(work, "bundles", digest, COMPLETE))
    return {"work": work, "cached": cached, "partial": f"bundles/.partial-{digest}"}


def compile_scripts(bundle: str) -> None:
    """Byte-compile a host's cached copy of a bundle's scripts/ once, for this interpreter
    (the wrapper's and the NVML audit's): every attempt's copy then carries the .pyc files
    (copies keep the sources' mtimes), instead of each attempt compiling the vendored
    pynvml.py (330 kB, ~0.1 s of CPU) twice, in the audit and in the precheck. Best effort."""
    import compileall  # here: hostside's other commands start without it

    with contextlib.suppress(Exception):
        compileall.compile_dir(os.path.join(bundle, "scripts"), maxlevels=0, quiet=2)


def stage_commit(work: str, digest: str) -> dict[str, Any]:
    """A finished transfer becomes the bundle for its digest, atomically."""
    partial = os.path.join(work, "bundles", f".partial-{digest}")
    final = os.path.join(work, "bundles", digest)
    missing = [p for p in FROZEN_PARTS if not os.path.exists(os.path.join(partial, p))]
    if missing:
        return {"error": f"the transfer into {partial} lacks {', '.join(missing)}"}
    compile_scripts(partial)
    with open(os.path.join(partial, COMPLETE), "w", encoding="utf-8") as f:
        f.write(digest + "\n")
    if os.path.exists(os.path.join(final, COMPLETE)):  # another push finished first
        shutil.rmtree(partial, ignore_errors=True)
    else:
        shutil.rmtree(final, ignore_errors=True)  # an incomplete leftover of another layout
        os.rename(partial, final)
    return {"bundle": final}


def stage_abort(work: str, digest: str) -> dict[str, Any]:
    shutil.rmtree(os.path.join(work, "bundles", f".partial-{digest}"), ignore_errors=True)
    return {}


class Changed(Exception):
    """A cached bundle whose files no longer give its digest: changed since it was frozen."""


def copy_verified(bundle: str, dest: str, digest: str, pycache: bool = False) -> dict[str, str]:
    """Copy a cached bundle's frozen parts into `dest` (made here) while hashing what is
    copied, as orbit.core.execution.bundle.compute_digest does; Changed (with `dest`
    removed) unless the copy's digest is `digest`. The attempt then runs exactly the
    verified bytes, whatever is done to the cache during or after the copy. Compiled
    Python (`__pycache__`, never part of a bundle) is left out unless `pycache`: only a
    cache no task can write may hand its .pyc files on. {relpath: sha256} of the files."""
    outer, files = hashlib.sha256(), {}

    def add(kind: str, rel: str, detail: str) -> None:
        outer.update(b"\0".join((kind.encode(), os.fsencode(rel), os.fsencode(detail))) + b"\n")

    def visit(rel: str) -> None:
        src, out = os.path.join(bundle, rel), os.path.join(dest, rel)
        st = os.lstat(src)
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(src)
            os.symlink(target, out)
            add("l", rel, target)
        elif stat.S_ISDIR(st.st_mode):
            os.mkdir(out, 0o755)  # the umask applies: an attempt's files are its owner's
            add("d", rel, "")
            for name in sorted(os.listdir(src), key=os.fsencode):
                if name == "__pycache__":
                    if pycache:
                        _copy_pycache(os.path.join(src, name), os.path.join(out, name))
                    continue
                visit(f"{rel}/{name}")
        elif stat.S_ISREG(st.st_mode):
            files[rel] = _copy_hashed(src, out, st)
            add("f", rel, files[rel] + (":x" if st.st_mode & 0o111 else ":-"))
        else:
            raise Changed(f"{rel} is not a file, folder or link")

    os.makedirs(dest)
    try:
        for part in FROZEN_PARTS:
            if part == "job.json" or os.path.lexists(os.path.join(bundle, part)):
                visit(part)
        if outer.hexdigest() != digest:
            raise Changed(f"its files give digest {outer.hexdigest()[:12]}")
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return files


def _copy_pycache(src: str, out: str) -> None:
    shutil.copytree(src, out, symlinks=True)


def _copy_hashed(src: str, out: str, st: os.stat_result) -> str:
    """Copy one file (never through a link), keeping its times (a .pyc beside a source is
    valid only for the source's mtime); the sha256 of the bytes written."""
    h = hashlib.sha256()
    fd = os.open(src, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        executable = bool(st.st_mode & 0o111)
        made = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755 if executable else 0o644)
        with os.fdopen(fd, "rb", closefd=False) as f, os.fdopen(made, "wb") as w:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
                w.write(block)
        if executable and not os.stat(out).st_mode & 0o100:  # a umask that takes even that
            os.chmod(out, os.stat(out).st_mode | 0o100)
        os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        os.close(fd)
    return h.hexdigest()


def prepare(work: str, digest: str, attempt_id: str) -> dict[str, Any]:
    """The attempt's own copy of the cached bundle, checked against its digest on the way,
    with fresh, empty runtime/ and artifacts/. runtime/ is made last: a folder without it is
    a copy that never finished. A cached bundle that no longer gives its digest (a task of
    another attempt rewrote it, say) is removed from the cache, so that the next launch
    stages it afresh, and the attempt is refused: what it would run is not what was frozen."""
    bundle = os.path.join(work, "bundles", digest)
    dest = os.path.join(work, "attempts", attempt_id)
    if not os.path.exists(os.path.join(bundle, COMPLETE)):
        return {"error": f"bundle {digest[:12]} is not staged in {bundle}"}
    if os.path.exists(dest):
        if os.path.exists(os.path.join(dest, "runtime", "pid")):
            return {"error": f"{dest} already exists: attempt {attempt_id} was launched before"}
        shutil.rmtree(dest)  # prepared before, never launched (its reply was lost): again
    try:
        copy_verified(bundle, dest, digest)
        for part in ("artifacts", "runtime"):
            os.mkdir(os.path.join(dest, part))
    except Changed as exc:
        shutil.rmtree(bundle, ignore_errors=True)
        return {"error": changed_message(digest, str(exc), "this host's")}
    except OSError as exc:
        shutil.rmtree(dest, ignore_errors=True)
        return {"error": f"copying the bundle into {dest}: {exc}"}
    return {"location": dest}


def copy_attempt(bundle: str, dest: str, digest: str) -> dict[str, Any]:
    """`dest` made afresh as a verified copy of `bundle` with empty runtime/ and artifacts/."""
    shutil.rmtree(dest, ignore_errors=True)
    try:
        copy_verified(bundle, dest, digest)
        for part in ("artifacts", "runtime"):
            os.mkdir(os.path.join(dest, part))
    except Changed as exc:
        return {
            "error": f"bundle {digest[:12]} in the cluster's cache was changed after it "
            f"was staged ({exc}): this rank is not run"
        }
    except OSError as exc:
        shutil.rmtree(dest, ignore_errors=True)
        return {"error": f"copying the bundle into {dest}: {exc}"}
    return {"location": dest}


def changed_message(digest: str, why: str, where: str) -> str:
    return (
        f"bundle {digest[:12]} in {where} cache was changed after it was staged ({why}): "
        "not run, and removed from the cache so that it is staged again"
    )
