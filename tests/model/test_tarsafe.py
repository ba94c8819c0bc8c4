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


@pytest.mark.parametrize("filters", [True, False], ids=["data-filter", "own-checks"])
def test_what_is_written_is_the_same_with_or_without_python_s_filter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filters: bool
) -> None:
    """Python before 3.11.4 (Debian 12's 3.11.2) has no `data` filter: ORBIT writes each member
    as that filter would, owned by whoever unpacks it and without special or shared-write bits."""
    import os

    from orbit.model import tarsafe

    if filters and not tarsafe.HAS_FILTERS:
        pytest.skip("this Python has no tar filters")
    monkeypatch.setattr(tarsafe, "HAS_FILTERS", filters)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as out:
        for name, mode, kind in [
            ("bin", 0o777, tarfile.DIRTYPE),
            ("bin/tool", 0o6777, tarfile.REGTYPE),
            ("bin/notes", 0o404, tarfile.REGTYPE),
        ]:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.uid, info.gid = kind, mode, 4242, 4343
            info.uname = info.gname = "someone"
            out.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    buf.seek(0)
    with tarfile.open(fileobj=buf, mode="r") as tar:
        extract_all(tar, tmp_path, "inputs")
    modes = {p.name: p.stat().st_mode & 0o7777 for p in (tmp_path / "bin").iterdir()}
    assert modes == {"tool": 0o755, "notes": 0o604}
    assert (tmp_path / "bin").stat().st_mode & 0o7777 == 0o755
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in tmp_path.rglob("*")}
    assert owners == {(os.getuid(), os.getgid())}
