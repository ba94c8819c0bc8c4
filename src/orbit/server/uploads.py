"""A submission's gathered inputs, as a client sent them (tar.gz): unpacked into a scratch
folder that is removed afterwards, refusing anything that could write outside it (absolute
paths, `..`, links that lead out or are walked through, devices; see orbit.model.tarsafe) and
anything over the configured limits."""

from __future__ import annotations

import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from orbit.model.errors import InvalidInput
from orbit.model.tarsafe import FILTER_ERRORS, check_member, extract_member
from orbit.server.config import Limits
from orbit.server.problems import DISK_FULL


@contextmanager
def unpack_inputs(stream: IO[bytes], limits: Limits, within: Path | None = None) -> Iterator[Path]:
    """`within`: where the scratch folder goes (the server's home, beside the bundles that
    link its files), else the temporary folder."""
    scratch = Path(tempfile.mkdtemp(prefix=".inputs-" if within else "orbit-inputs-", dir=within))
    try:
        folder = scratch / "inputs"
        folder.mkdir()
        _unpack(stream, folder, limits)
        yield folder
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _unpack(stream: IO[bytes], folder: Path, limits: Limits) -> None:
    try:
        with tarfile.open(fileobj=stream, mode="r:*") as tar:
            members, size = [], 0
            links: set[str] = set()
            files: set[str] = set()
            for member in tar:
                check_member(member, links, files, "inputs")  # see orbit.model.tarsafe
                members.append(member)
                size += max(member.size, 0)
                within_limits(len(members), size, limits)
            for member in members:
                try:
                    extract_member(tar, member, folder)
                except FILTER_ERRORS as exc:
                    raise InvalidInput(f"inputs: {member.name}: {_why(exc)}") from None
    except (tarfile.TarError, EOFError, OSError) as exc:
        if isinstance(exc, FILTER_ERRORS) or getattr(exc, "errno", None) in DISK_FULL:
            raise  # a full disk is the server's: not the archive's fault
        why = " ".join(str(exc).split())  # tarfile's own can run over several lines
        raise InvalidInput(f"inputs: not a readable tar archive ({why})") from None


def within_limits(files: int, size: int, limits: Limits) -> None:
    """Refused, naming the limit, where inputs of `files` files and `size` bytes unpacked are
    more than a client may send (an upload's, or inputs held from one)."""
    if files > limits.inputs_files:
        raise InvalidInput(f"inputs: more than {limits.inputs_files:,} files (limits.inputs_files)")
    if size > limits.inputs_bytes:
        raise InvalidInput(
            f"inputs: more than {limits.inputs_bytes:,} bytes unpacked (limits.inputs_bytes)"
        )


def _why(exc: Exception) -> str:
    return {
        tarfile.AbsolutePathError: "an absolute path",
        tarfile.OutsideDestinationError: "a path outside the inputs",
        tarfile.AbsoluteLinkError: "a link to an absolute path",
        tarfile.LinkOutsideDestinationError: "a link that leads outside the inputs",
        tarfile.SpecialFileError: "not a file, folder or link",
    }.get(type(exc), str(exc))
