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
from typing import Any

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


MODES = {"f": b"100644", "x": b"100755", "link": b"120000"}  # file_hashes' kinds, as git's


def file_hashes(folder: str) -> dict[str, str]:
    """path -> kind and git blob id ("f:ID", "x:ID" executable, "link:ID" of its target) of
    every file and link under `folder`, links never followed: the tree id is made of these
    (tree_of), and two listings say which files changed (changed_files)."""
    found: dict[str, str] = {}

    def walk(path: str, rel: str) -> None:
        for name in os.listdir(path):
            if name == ".git" or name in SKIP:
                continue
            full, child = os.path.join(path, name), f"{rel}/{name}" if rel else name
            info = os.lstat(full)
            if stat.S_ISLNK(info.st_mode):
                found[child] = "link:" + _object(b"blob", os.fsencode(os.readlink(full))).hex()
            elif stat.S_ISDIR(info.st_mode):
                walk(full, child)
            elif stat.S_ISREG(info.st_mode):
                kind = "x" if info.st_mode & stat.S_IXUSR else "f"
                found[child] = f"{kind}:{_blob(full).hex()}"

    walk(folder, "")
    return found


def tree_of(hashes: dict[str, str], submodules: dict[str, str] | None = None) -> str:
    """The tree id (hex) of the files `hashes` lists (file_hashes); `submodules`: path from
    the top -> its commit (hex)."""
    root: dict[str, Any] = {}
    leaves = [
        (p, (MODES[v.partition(":")[0]], bytes.fromhex(v.partition(":")[2])))
        for p, v in hashes.items()
    ]
    leaves += [(p, (b"160000", bytes.fromhex(c))) for p, c in (submodules or {}).items()]
    for rel, leaf in leaves:
        *folders, name = rel.split("/")
        node = root
        for folder in folders:
            node = node.setdefault(folder, {})
        node[name] = leaf
    return (_tree(root) or _object(b"tree", b"")).hex()


def _tree(node: dict[str, Any]) -> bytes | None:
    """A folder's tree id from its entries; None for a folder git would not hold (empty)."""
    entries = []
    for name, child in node.items():
        if isinstance(child, dict):
            sub = _tree(child)
            if sub is not None:
                entries.append((name + "/", b"40000", sub))  # a folder sorts as NAME/
        else:
            entries.append((name, *child))
    if not entries:
        return None
    entries.sort(key=lambda e: os.fsencode(e[0]))
    body = b"".join(
        mode + b" " + os.fsencode(name.rstrip("/")) + b"\0" + raw for name, mode, raw in entries
    )
    return _object(b"tree", body)


def tree_id(folder: str, submodules: dict[str, str] | None = None) -> str:
    """The tree id (hex) of `folder` as it is on disk."""
    return tree_of(file_hashes(folder), submodules)


def changed_files(before: dict[str, str], after: dict[str, str]) -> tuple[str, ...]:
    """The paths whose content differs between two `file_hashes` listings (added, removed or
    changed), sorted."""
    return tuple(sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p)))
