"""The client's files, as a task plugin sees them when `orbit server` shapes a task again.

Through a server, the files a task request names are on the client's machine. The client stages
them into inputs/ and sends them with where each came from (its staged sources) and the paths
of its request that lead through a symlink (its links). The server then shapes the request
again with the same plugin (orbit.core.control.reshape), and the plugin must find those files
where the request names them. It is handed a ClientPath as its base_dir: a path of the
client's machine that reads, joins and prints as that path, while every look at the disk
(whatever goes through os.fspath: stat, open, realpath) goes to a mirror of the client's
folders in a scratch folder, whose staged parts are links into the uploaded inputs.

Nothing of the server's own disk is reached through a ClientPath, whatever the request names:
an absolute path or a `..` stays inside the mirror, the mirror's links lead into the inputs,
and the inputs' own links stay inside them (orbit.server.uploads). A plugin that builds paths
of its own (Path(request.file) rather than base_dir / request.file) looks at the server's
disk instead: the plugin contract (orbit.model.task.TaskPlugin) asks for base_dir."""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
from collections.abc import Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PosixPath
from typing import Any, ClassVar, Self

MAX_LINKS = 64  # request values followed through symlinks, at most
UNKNOWN = "/.orbit-not-sent"  # where a file of the inputs that no staged source gave appears


@dataclass(frozen=True)
class ClientFiles:
    """The mirror of the client's folders (`mirror`) and the inputs its links lead into,
    with the staged sources that put each part of the inputs there."""

    mirror: str
    inputs: str
    staged: tuple[tuple[str, str], ...]  # (client path, dest under inputs/)

    def on_disk(self, client_path: str) -> str:
        """Where the client's path is in the mirror (never above it: normpath stops at /)."""
        return self.mirror + posixpath.normpath(posixpath.join("/", client_path))

    def on_client(self, real: str) -> str:
        """The client's path of a real path in the mirror or the inputs."""
        if real == self.inputs or real.startswith(self.inputs + "/"):
            rel = real[len(self.inputs) + 1 :]
            for source, dest in sorted(self.staged, key=lambda s: -len(s[1])):
                if rel == dest or rel.startswith(dest + "/"):
                    return source + rel[len(dest) :]
            return posixpath.join(UNKNOWN, rel)
        if real == self.mirror or real.startswith(self.mirror + "/"):
            return real[len(self.mirror) :] or "/"
        return UNKNOWN  # cannot be: the mirror's links and the inputs' lead nowhere else


class ClientPath(PosixPath):
    """A path of the client's machine (see the module's docstring). Each shaping makes a
    subclass whose `_files` is its mirror; pathlib makes every path derived from one (joined,
    a parent, resolved) of that same subclass."""

    _files: ClassVar[ClientFiles]

    def __fspath__(self) -> str:
        return self._files.on_disk(str(self))

    def resolve(self, strict: bool = False) -> Self:
        real = os.path.realpath(os.fspath(self), strict=strict)
        return type(self)(self._files.on_client(real))

    # Listing folders: Python 3.13's pathlib lists str(self) rather than os.fspath(self), so
    # these list the mirror's folder and give its entries back at the client's paths.
    def iterdir(self) -> Generator[Self, None, None]:
        for found in self._mirrored().iterdir():
            yield self._back(found)

    def glob(self, pattern: str, *args: Any, **kwargs: Any) -> Generator[Self, None, None]:
        for found in self._mirrored().glob(pattern, *args, **kwargs):
            yield self._back(found)

    def rglob(self, pattern: str, *args: Any, **kwargs: Any) -> Generator[Self, None, None]:
        for found in self._mirrored().rglob(pattern, *args, **kwargs):
            yield self._back(found)

    def walk(self, *args: Any, **kwargs: Any) -> Iterator[tuple[Self, list[str], list[str]]]:
        """Path.walk (Python 3.12 on)."""
        walk: Any = self._mirrored().walk  # type: ignore[attr-defined,unused-ignore]
        for root, folders, files in walk(*args, **kwargs):
            yield self._back(root), folders, files

    def _mirrored(self) -> Path:
        return Path(os.fspath(self))

    def _back(self, found: Path) -> Self:
        return self / found.relative_to(self._mirrored())


@contextmanager
def client_base(
    inputs: Path,
    base_dir: str,
    staged: Sequence[tuple[str, str]],
    links: Sequence[tuple[str, str]] = (),
) -> Iterator[Path]:
    """`base_dir` of the client as a ClientPath over `inputs`, for one shaping."""
    scratch = Path(tempfile.mkdtemp(prefix="orbit-client-"))
    try:
        mirror = str(scratch.resolve() / "mirror")
        os.mkdir(mirror)
        real_inputs = str(inputs.resolve())
        # parents before children: a part under a linked one is reached through that link
        for source, dest in sorted(staged, key=lambda s: len(s[0])):
            _place(mirror, source, posixpath.join(real_inputs, dest))
        for path, target in links:
            _place(mirror, path, mirror + target)
        files = ClientFiles(mirror, real_inputs, tuple(staged))
        kind = type("ClientPath", (ClientPath,), {"_files": files})
        yield kind(base_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _place(mirror: str, client_path: str, target: str) -> None:
    """A link at the client's path in the mirror to `target`, unless something is there
    already or on the way (a link placed before: what is under it is reached through it)."""
    if client_path == "/":
        return
    parts = client_path.strip("/").split("/")
    here = mirror
    for part in parts[:-1]:
        here = f"{here}/{part}"
        if os.path.islink(here) or (os.path.exists(here) and not os.path.isdir(here)):
            return
        if not os.path.exists(here):
            os.mkdir(here)
    place = f"{here}/{parts[-1]}"
    if not os.path.lexists(place):
        os.symlink(target, place)


def request_links(request: Any, base_dir: Path) -> list[tuple[str, str]]:
    """On the client: the paths of the request (its text values, joined to `base_dir`) that
    lead through a symlink, each with where it leads. The server mirrors them, so that a
    plugin resolves such a path there as it did here."""
    found: dict[str, str] = {}
    for text in _texts(request):
        if len(found) >= MAX_LINKS:
            break
        if "\x00" in text or len(text) > 4096:
            continue
        path = os.path.join(base_dir, text)
        try:
            if not os.path.lexists(path):
                continue
            real = os.path.realpath(path)
        except (OSError, ValueError):
            continue
        lexical = os.path.normpath(path)
        if real != lexical:
            found.setdefault(lexical, real)
    return sorted(found.items())


def _texts(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _texts(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _texts(item)
