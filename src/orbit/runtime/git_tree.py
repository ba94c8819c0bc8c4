"""The git tree id of a folder as it is on disk: what `git rev-parse COMMIT^{tree}` says of the
commit whose files these are, computed without git (a node need not have it). A pinned upstream
staged from a commit is checked with it before anything of it runs, and again after the run: a
file changed, added, removed or made executable gives another id. Standard library only (it
travels into bundles beside the launchers that use it); Python 3.8+.

Git stores a file as a blob (sha1 of "blob SIZE\\0" and its bytes), a link as a blob of its
target, and a folder as a tree: its entries "MODE NAME\\0" + the raw id, sorted by name with a
folder's name compared as if it ended in "/" (a submodule's not). Empty folders are not in git;
a submodule's folder is (mode 160000, its commit), which cannot be told from disk: `submodules`
gives those.
"""

from __future__ import annotations

import hashlib
import os
import stat

SKIP = ("__pycache__",)  # what Python writes beside imported modules, never part of a commit


def _object(kind: bytes, body: bytes) -> bytes:
    return hashlib.sha1(kind + b" " + str(len(body)).encode() + b"\0" + body).digest()


def _blob(path: str) -> bytes:
    digest = hashlib.sha1()
    size = os.lstat(path).st_size
    digest.update(b"blob " + str(size).encode() + b"\0")
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.digest()


def _tree(folder: str, submodules: dict[str, str], rel: str) -> bytes | None:
    """The tree id of `folder` (`rel` from the top), None for a folder git would not hold."""
    entries = []
    for name in os.listdir(folder):
        if name == ".git" or name in SKIP:
            continue
        path = os.path.join(folder, name)
        child = f"{rel}/{name}" if rel else name
        info = os.lstat(path)
        if child in submodules:
            entries.append((name, b"160000", bytes.fromhex(submodules[child])))  # not a folder
        elif stat.S_ISLNK(info.st_mode):
            target = os.fsencode(os.readlink(path))
            entries.append((name, b"120000", _object(b"blob", target)))
        elif stat.S_ISDIR(info.st_mode):
            sub = _tree(path, submodules, child)
            if sub is not None:
                entries.append((name + "/", b"40000", sub))
        elif stat.S_ISREG(info.st_mode):
            mode = b"100755" if info.st_mode & stat.S_IXUSR else b"100644"
            entries.append((name, mode, _blob(path)))
    if not entries:
        return None
    entries.sort(key=lambda e: os.fsencode(e[0]))
    body = b"".join(
        mode + b" " + os.fsencode(name.rstrip("/")) + b"\0" + raw for name, mode, raw in entries
    )
    return _object(b"tree", body)


def tree_id(folder: str, submodules: dict[str, str] | None = None) -> str:
    """The tree id (hex) of `folder`; `submodules`: path from the top -> its commit (hex)."""
    found = _tree(folder, submodules or {}, "")
    return (found or _object(b"tree", b"")).hex()


def changed_files(before: dict[str, str], after: dict[str, str]) -> tuple[str, ...]:
    """The paths whose content differs between two `file_hashes` listings (added, removed or
    changed), sorted."""
    return tuple(sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p)))


def file_hashes(folder: str) -> dict[str, str]:
    """path -> git blob id (and mode) of every file and link under `folder`: to say which ones
    changed when the tree id did."""
    found = {}
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if d != ".git" and d not in SKIP]
        for name in names:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                found[rel] = "link:" + _object(b"blob", os.fsencode(os.readlink(path))).hex()
            elif stat.S_ISREG(info.st_mode):
                mode = "x" if info.st_mode & stat.S_IXUSR else "f"
                found[rel] = f"{mode}:{_blob(path).hex()}"
    return found
