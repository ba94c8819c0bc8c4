"""Unpacking archives from the network: nothing lands outside the folder, whatever the tar
holds (including the symlink chains that lead Python < 3.11.13's `data` filter astray)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from orbit.model.errors import InvalidInput
from orbit.model.tarsafe import extract_all


def archive(*members: tuple[str, str, str]) -> tarfile.TarFile:
    """(kind, name, content-or-target): kind is file, dir, sym, link or fifo."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for kind, name, value in members:
            info = tarfile.TarInfo(name)
            data = None
            if kind == "file":
                data = value.encode()
                info.size = len(data)
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, value
            elif kind == "link":
                info.type, info.linkname = tarfile.LNKTYPE, value
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    buf.seek(0)
    return tarfile.open(fileobj=buf, mode="r")


def test_a_plain_tree_with_inner_links_unpacks_as_it_was(tmp_path: Path) -> None:
    tar = archive(
        ("dir", "workdir", ""),
        ("file", "workdir/train.py", "print(1)\n"),
        ("sym", "workdir/latest.py", "train.py"),
        ("link", "workdir/copy.py", "workdir/train.py"),
    )
    extract_all(tar, tmp_path, "inputs")
    assert (tmp_path / "workdir" / "latest.py").read_text() == "print(1)\n"
    assert (tmp_path / "workdir" / "copy.py").read_text() == "print(1)\n"


@pytest.mark.parametrize(
    ("members", "why"),
    [
        ([("file", "/etc/evil", "x")], "an absolute path"),
        ([("file", "../evil", "x")], "outside the inputs"),
        ([("file", "a/../../evil", "x")], "outside the inputs"),
        ([("sym", "out", "/etc")], "a link to an absolute path"),
        ([("sym", "out", "../..")], "leads outside the inputs"),
        ([("sym", "a/b", "../../x")], "leads outside the inputs"),
        ([("sym", "d", "."), ("file", "d/evil", "x")], "reached through a symbolic link"),
        ([("link", "h", "/etc/passwd")], "a link that leads outside the inputs"),
        ([("link", "h", "elsewhere")], "a hard link to a file not in the archive"),
        ([("fifo", "pipe", "")], "not a file, folder or link"),
    ],
)
def test_anything_that_could_leave_the_folder_is_refused_by_name_and_nothing_is_written(
    tmp_path: Path, members: list[tuple[str, str, str]], why: str
) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(InvalidInput, match=why) as caught:
        extract_all(archive(*members), dest, "inputs")
    assert str(caught.value).startswith(f"inputs: {members[-1][1]}: ")
    assert list(dest.iterdir()) == []


def test_the_cve_2025_4517_symlink_chain_is_refused(tmp_path: Path) -> None:
    """The published shape of the bypass: a deep chain of directories and symlinks whose
    resolved path exceeds PATH_MAX, then a link that climbs through it."""
    comp = "d" * 247
    steps = "abcdefghijklmnop"
    members: list[tuple[str, str, str]] = []
    path = ""
    for step in steps:
        members.append(("dir", f"{path}{comp}", ""))
        members.append(("sym", f"{path}{step}", comp))
        path += f"{comp}/"
    chain = "/".join(steps)
    members.append(("sym", "escape", f"{chain}/" + "../" * len(steps) + ".."))
    members.append(("file", "escape/owned", "x"))
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(InvalidInput):
        extract_all(archive(*members), dest, "inputs")
    assert not (tmp_path / "owned").exists()
