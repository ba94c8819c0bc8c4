"""The bundle: freezing staged inputs, the digest that is its identity, and its archive."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import stat
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbit.core.execution.bundle import (
    FrozenBundle,
    canonical_json,
    compute_digest,
    copy_frozen,
    freeze_bundle,
    load_job,
)
from orbit.core.execution.bundle_archive import (
    UnsafeArchive,
    create_bundle_archive,
    extract_bundle_archive,
)
from orbit.model.errors import InvalidInput
from orbit.model.models import JobSpec, LaunchMode, Resources
from orbit.model.task import StagedPath

# A tree is {relative path: (content, executable)}. Folder names carry no dot and file names
# end in ".txt", so no path is both a file and a folder, and none is an ignored name.
NAME = st.text(alphabet="abcdefghij-_", min_size=1, max_size=6)
RELPATH = st.tuples(st.lists(NAME, max_size=2), NAME).map(
    lambda t: "/".join([*t[0], t[1] + ".txt"])
)
TREE = st.dictionaries(
    RELPATH, st.tuples(st.binary(max_size=64), st.booleans()), min_size=1, max_size=6
)
Tree = dict[str, tuple[bytes, bool]]

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def job(**changes: object) -> JobSpec:
    fields: dict[str, object] = {
        "task_type": "command",
        "template_id": "local",
        "launch_mode": LaunchMode(kind="host_process"),
        "entrypoint": ("bash", "train.sh"),
        "env": {"SEED": "7"},
    }
    fields.update(changes)
    return JobSpec.model_validate(fields)


def write_tree(root: Path, tree: Tree, rnd: random.Random | None = None) -> Path:
    """Write `tree` under `root`. With `rnd`: in a shuffled order, with random mtimes and
    random permission bits that keep each file's executable-or-not."""
    root.mkdir(parents=True)
    items = list(tree.items())
    if rnd:
        rnd.shuffle(items)
    for rel, (content, executable) in items:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        if rnd:
            exec_modes, plain_modes = (0o755, 0o700, 0o744, 0o775), (0o644, 0o600, 0o664, 0o444)
            os.chmod(path, rnd.choice(exec_modes if executable else plain_modes))
            stamp = rnd.randint(0, 2_000_000_000)
            os.utime(path, (stamp, stamp))
        else:
            os.chmod(path, 0o755 if executable else 0o644)
    if rnd:
        for folder in sorted(
            {p for rel in tree for p in (root / rel).parents if root in p.parents}
        ):
            os.chmod(folder, rnd.choice((0o700, 0o755, 0o750)))
            stamp = rnd.randint(0, 2_000_000_000)
            os.utime(folder, (stamp, stamp))
    return root


def freeze(source: Path, cache: Path, spec: JobSpec | None = None) -> FrozenBundle:
    return freeze_bundle(spec or job(), [StagedPath(source, "workdir")], cache)


def leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.glob(".tmp-*"))


def tree_of(folder: Path) -> dict[str, str]:
    """Every path under `folder` with what it is: file content, link target or folder."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(folder).as_posix()
            if path.is_symlink():
                found[rel] = f"link:{os.readlink(path)}"
            elif path.is_dir():
                found[rel] = "dir"
            else:
                mode = "x" if path.stat().st_mode & 0o111 else "-"
                found[rel] = f"file:{mode}:{path.read_bytes().hex()}"
    return found


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A small staged folder like a user's: a script, a config, a nested data file."""
    return write_tree(
        tmp_path / "project",
        {
            "train.sh": (b"#!/bin/bash\necho training\n", True),
            "config.yaml": (b"lr: 0.001\n", False),
            "data/shard-0.txt": (b"hello\n", False),
        },
    )


def scratch() -> tempfile.TemporaryDirectory[str]:
    """A scratch folder for one hypothesis example (tmp_path lives for the whole test)."""
    return tempfile.TemporaryDirectory()


def other_filesystem() -> tempfile.TemporaryDirectory[str]:
    """A scratch folder on tmpfs where there is one: it lists a folder's entries in another
    order than the usual disk does (creation order, not name hash), so a digest that followed
    the listing order would differ between the two."""
    shm = Path("/dev/shm")
    usable = shm.is_dir() and os.access(shm, os.W_OK)
    return tempfile.TemporaryDirectory(dir=shm if usable else None)


# --- freeze and digest ------------------------------------------------------------------------


def test_a_frozen_bundle_holds_the_job_the_inputs_and_the_wrapper(
    workdir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "extra.yaml"
    config.write_text("epochs: 3\n")
    spec = job(stop_grace_s=2.5)
    bundle = freeze_bundle(
        spec,
        [StagedPath(workdir, "workdir"), StagedPath(config, "configs/extra.yaml")],
        tmp_path / "cache",
    )
    assert bundle.path == tmp_path / "cache" / bundle.digest
    assert len(bundle.digest) == 64 and int(bundle.digest, 16) >= 0
    assert load_job(bundle.path) == spec
    assert tree_of(bundle.path / "inputs" / "workdir") == tree_of(workdir)
    assert (bundle.path / "inputs" / "configs" / "extra.yaml").read_text() == "epochs: 3\n"
    for script in ("run.sh", "orbit_wrapper.py"):
        assert (bundle.path / "scripts" / script).stat().st_mode & 0o100
    assert compute_digest(bundle.path) == bundle.digest
    assert leftovers(tmp_path / "cache") == []


def test_job_json_without_a_gpu_memory_reservation_is_what_it_was_before_the_field(
    tmp_path: Path,
) -> None:
    """Bundles frozen before resources.gpu_memory_gb existed keep their digests: unset, it is
    not written. The sha256 values are job.json as frozen before the field was added."""
    pinned = {
        "d7256c2e22cc7818849a551b6e42f02998d75121fc6b22d7a13a6f9b22b9b537": job(
            template_id="pool",
            entrypoint=("bash", "task.sh"),
            env={},
            resources=Resources(gpu_type="H100", gpu_count=2, cpu_count=4, memory_gb=16),
        ),
        "a02fbf85a62a022fc2b1a2ef0140301de228ac44fad3c0d943d7119b9aec5c91": job(
            entrypoint=("bash", "task.sh"), env={}
        ),
    }
    for sha, spec in pinned.items():
        text = canonical_json(spec)
        assert "gpu_memory_gb" not in text
        assert hashlib.sha256(text.encode()).hexdigest() == sha
    # set, it is written, and the bundle reads it back
    shared = job(resources=Resources(gpu_count=1, gpu_memory_gb=20))
    assert json.loads(canonical_json(shared))["resources"]["gpu_memory_gb"] == 20.0
    bundle = freeze_bundle(shared, [], tmp_path / "cache")
    assert load_job(bundle.path).resources.gpu_memory_gb == 20.0
    unset = freeze_bundle(job(), [], tmp_path / "cache")
    assert load_job(unset.path).resources.gpu_memory_gb is None
    assert unset.digest != bundle.digest


def test_the_workdir_exists_even_when_nothing_is_staged(tmp_path: Path) -> None:
    bundle = freeze_bundle(job(workdir="run/here"), [], tmp_path / "cache")
    assert (bundle.path / "inputs" / "run" / "here").is_dir()


@FAST
@given(tree=TREE, first=st.randoms(use_true_random=False), second=st.randoms())
def test_same_content_gives_the_same_digest_and_cached_folder(
    tree: Tree, first: random.Random, second: random.Random
) -> None:
    """Mtimes, creation order, permission bits other than "executable" and the filesystem
    play no part."""
    with scratch() as d, other_filesystem() as other:
        root = Path(d)
        a = freeze(write_tree(root / "a", tree, first), root / "cache-a")
        b = freeze(write_tree(Path(other) / "b", tree, second), Path(other) / "cache-b")
        assert a.digest == b.digest
        assert tree_of(a.path) == tree_of(b.path)
        again = freeze(root / "a", root / "cache-a")
        assert again == a
        assert [p.name for p in (root / "cache-a").iterdir()] == [a.digest]


def _mutations(tree: Tree, data: st.DataObject) -> tuple[Tree, list[str], JobSpec]:
    """One change a user could make, drawn by hypothesis: (new tree, empty folders, job)."""
    kind = data.draw(
        st.sampled_from(["byte", "append", "rename", "move", "exec", "empty_dir", "job"])
    )
    tree = dict(tree)
    rel = data.draw(st.sampled_from(sorted(tree)))
    content, executable = tree[rel]
    parent, _, name = rel.rpartition("/")
    prefix = f"{parent}/" if parent else ""
    empty: list[str] = []
    spec = job()
    if kind == "byte" and content:
        i = data.draw(st.integers(0, len(content) - 1))
        flip = data.draw(st.integers(1, 255))
        tree[rel] = (content[:i] + bytes([content[i] ^ flip]) + content[i + 1 :], executable)
    elif kind in ("byte", "append"):
        tree[rel] = (content + data.draw(st.binary(min_size=1, max_size=4)), executable)
    elif kind == "rename":  # "r", "n", "m" are outside NAME's alphabet: no clash
        tree[f"{prefix}renamed-{name}"] = tree.pop(rel)
    elif kind == "move":
        tree[f"{prefix}moved/{name}"] = tree.pop(rel)
    elif kind == "exec":
        tree[rel] = (content, not executable)
    elif kind == "empty_dir":
        empty.append(f"{prefix}empty")
    else:
        spec = data.draw(
            st.sampled_from(
                [
                    job(env={"SEED": "8"}),
                    job(entrypoint=("bash", "train.sh", "--fast")),
                    job(stop_grace_s=11.0),
                    job(workdir="elsewhere"),
                ]
            )
        )
    return tree, empty, spec


@FAST
@given(tree=TREE, data=st.data())
def test_any_change_to_the_frozen_content_changes_the_digest(
    tree: Tree, data: st.DataObject
) -> None:
    changed, empty_dirs, spec = _mutations(tree, data)
    with scratch() as d:
        root = Path(d)
        before = freeze(write_tree(root / "before", tree), root / "cache")
        source = write_tree(root / "after", changed)
        for folder in empty_dirs:
            (source / folder).mkdir(parents=True)
        after = freeze(source, root / "cache", spec)
        assert after.digest != before.digest
        assert sorted(p.name for p in (root / "cache").iterdir()) == sorted(
            [before.digest, after.digest]
        )


@FAST
@given(
    tree=TREE,
    live=st.dictionaries(
        st.tuples(st.sampled_from(["runtime", "artifacts"]), RELPATH).map("/".join),
        st.binary(max_size=32),
        min_size=1,
        max_size=5,
    ),
)
def test_runtime_and_artifacts_never_affect_the_digest(tree: Tree, live: dict[str, bytes]) -> None:
    with scratch() as d:
        root = Path(d)
        bundle = freeze(write_tree(root / "src", tree), root / "cache")
        attempt = root / "attempt"
        copy_frozen(bundle, attempt)
        assert compute_digest(attempt) == bundle.digest
        for rel, content in live.items():
            path = attempt / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
        (attempt / "runtime" / "empty-folder").mkdir(exist_ok=True)
        assert compute_digest(attempt) == bundle.digest


def test_a_copy_keeps_its_digest_whatever_its_modes_and_mtimes(
    workdir: Path, tmp_path: Path
) -> None:
    """A bundle copied by other tools (a umask, `cp`, an unpacker) still has its identity,
    until an executable bit changes."""
    bundle = freeze(workdir, tmp_path / "cache")
    copy = tmp_path / "copy"
    copy_frozen(bundle, copy)
    staged = copy / "inputs" / "workdir"
    os.chmod(staged / "config.yaml", 0o600)
    os.chmod(staged / "train.sh", 0o700)
    os.chmod(staged / "data", 0o700)
    for path in [copy / "job.json", *staged.rglob("*")]:
        os.utime(path, (1, 1))
    assert compute_digest(copy) == bundle.digest
    os.chmod(staged / "config.yaml", 0o640 | 0o010)  # group-executable only: still executable
    assert compute_digest(copy) != bundle.digest


def test_large_files_count_byte_for_byte(tmp_path: Path) -> None:
    """Files over a MiB take another road through the hasher: same rules."""
    big = bytes(range(256)) * (9 * 1024)  # 2.25 MiB
    digests = []
    for i, content in enumerate([big, big, big[:-1] + b"\0", big + b"!"]):
        src = write_tree(tmp_path / f"src-{i}", {"weights.bin": (content, False)})
        os.utime(src / "weights.bin", (i * 1000, i * 1000))
        digests.append(freeze(src, tmp_path / f"cache-{i}").digest)
    assert digests[0] == digests[1]
    assert len(set(digests)) == 3


def test_a_changed_symlink_target_changes_the_digest(tmp_path: Path) -> None:
    digests = set()
    for target in ("a.txt", "b.txt"):
        src = write_tree(tmp_path / target, {"a.txt": (b"a", False), "b.txt": (b"b", False)})
        os.symlink(target, src / "current")
        digests.add(freeze(src, tmp_path / "cache").digest)
    assert len(digests) == 2


# --- what freeze refuses and what it leaves out ----------------------------------------------


@pytest.mark.parametrize(
    ("link", "target"),
    [
        ("escape", "../secret.txt"),
        ("data/escape", "../../secret.txt"),
        ("escape", "{outside}"),  # absolute, outside
        ("escape", "{inside}"),  # absolute, even inside: it breaks once the bundle moves
        ("escape", "data/hop"),  # inside, but only to a link that leaves
    ],
)
def test_freeze_refuses_a_symlink_that_leaves_the_staged_folder(
    workdir: Path, tmp_path: Path, link: str, target: str
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("do not ship me\n")
    target = target.format(outside=secret, inside=workdir / "config.yaml")
    if target == "data/hop":
        os.symlink("../../secret.txt", workdir / "data" / "hop")
    os.symlink(target, workdir / link)
    cache = tmp_path / "cache"
    with pytest.raises(InvalidInput, match="symlink points outside") as err:
        freeze(workdir, cache)
    assert str(workdir) in str(err.value)
    if target != "data/hop":  # either link may be met first
        assert str(workdir / link) in str(err.value)
    assert leftovers(cache) == []
    assert list(cache.iterdir()) == []


def test_freeze_refuses_a_fifo(workdir: Path, tmp_path: Path) -> None:
    os.mkfifo(workdir / "data" / "pipe")
    cache = tmp_path / "cache"
    with pytest.raises(InvalidInput, match="special files") as err:
        freeze(workdir, cache)
    assert str(workdir / "data" / "pipe") in str(err.value)
    assert list(cache.iterdir()) == []


def test_freeze_refuses_a_missing_source(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(InvalidInput, match="no such file"):
        freeze(tmp_path / "nowhere", cache)
    assert list(cache.iterdir()) == []


def test_freeze_keeps_symlinks_that_stay_inside(workdir: Path, tmp_path: Path) -> None:
    os.symlink("data/shard-0.txt", workdir / "latest.txt")
    os.symlink("../config.yaml", workdir / "data" / "config.yaml")
    os.symlink("data", workdir / "data-link")
    bundle = freeze(workdir, tmp_path / "cache")
    staged = bundle.path / "inputs" / "workdir"
    assert os.readlink(staged / "latest.txt") == "data/shard-0.txt"
    assert os.readlink(staged / "data" / "config.yaml") == "../config.yaml"
    assert os.readlink(staged / "data-link") == "data"
    assert (staged / "latest.txt").read_text() == "hello\n"
    assert (staged / "data-link" / "shard-0.txt").read_text() == "hello\n"


def test_freeze_leaves_out_caches_environments_and_vcs(workdir: Path, tmp_path: Path) -> None:
    clean = freeze(workdir, tmp_path / "cache")
    for junk in (".git/HEAD", "__pycache__/m.cpython-311.pyc", ".venv/bin/python", "data/m.pyc"):
        path = workdir / junk
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("junk")
    dirty = freeze(workdir, tmp_path / "cache")
    staged = dirty.path / "inputs" / "workdir"
    assert not (staged / ".git").exists()
    assert not (staged / "__pycache__").exists()
    assert not (staged / ".venv").exists()
    assert not (staged / "data" / "m.pyc").exists()
    assert dirty.digest == clean.digest


# --- the archive that travels ---------------------------------------------------------------


def frozen_names(bundle_dir: Path) -> set[str]:
    names = {"job.json"}
    for part in ("inputs", "scripts"):
        names.add(part)
        for dirpath, dirnames, filenames in os.walk(bundle_dir / part):
            for name in dirnames + filenames:
                names.add((Path(dirpath) / name).relative_to(bundle_dir).as_posix())
    return names


@pytest.fixture
def attempt(workdir: Path, tmp_path: Path) -> tuple[FrozenBundle, Path]:
    """A frozen bundle and an attempt's copy of it whose runtime/ and artifacts/ are full."""
    os.symlink("data/shard-0.txt", workdir / "latest.txt")
    (workdir / "empty").mkdir()
    bundle = freeze(workdir, tmp_path / "cache")
    copy = tmp_path / "attempt"
    copy_frozen(bundle, copy)
    (copy / "runtime" / "status.json").write_text('{"state": "running"}')
    (copy / "artifacts" / "checkpoints").mkdir()
    (copy / "artifacts" / "checkpoints" / "step-1.pt").write_bytes(b"\0" * 100)
    return bundle, copy


def test_the_archive_holds_only_the_frozen_parts(
    attempt: tuple[FrozenBundle, Path], tmp_path: Path
) -> None:
    _, copy = attempt
    archive = create_bundle_archive(copy, tmp_path / "bundle.tar")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        members = {m.name: m for m in tar.getmembers()}
    assert names == frozen_names(copy)
    assert not any(n.split("/")[0] in ("runtime", "artifacts") for n in names)
    assert members["inputs/workdir/latest.txt"].issym()
    assert members["inputs/workdir/train.sh"].mode & 0o111
    assert not members["inputs/workdir/config.yaml"].mode & 0o111
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 for m in members.values())


def test_the_archive_is_byte_identical_when_made_again(
    attempt: tuple[FrozenBundle, Path], tmp_path: Path
) -> None:
    bundle, copy = attempt
    for path in (copy / "inputs" / "workdir").rglob("*"):
        if not path.is_symlink():
            os.utime(path, (12345, 12345))
    os.chmod(copy / "inputs" / "workdir" / "config.yaml", 0o600)
    first = create_bundle_archive(bundle.path, tmp_path / "first.tar").read_bytes()
    second = create_bundle_archive(bundle.path, tmp_path / "second.tar").read_bytes()
    from_copy = create_bundle_archive(copy, tmp_path / "copy.tar").read_bytes()
    assert first == second == from_copy


def test_the_archive_round_trips_to_the_same_digest(
    attempt: tuple[FrozenBundle, Path], tmp_path: Path
) -> None:
    bundle, copy = attempt
    archive = create_bundle_archive(copy, tmp_path / "bundle.tar")
    out = extract_bundle_archive(archive, tmp_path / "elsewhere" / "bundle")
    assert compute_digest(out) == bundle.digest
    assert tree_of(out / "inputs") == tree_of(bundle.path / "inputs")
    assert (out / "job.json").read_bytes() == (bundle.path / "job.json").read_bytes()
    assert list((out / "runtime").iterdir()) == []
    assert list((out / "artifacts").iterdir()) == []
    assert sorted(p.name for p in out.parent.iterdir()) == ["bundle"]


@FAST
@given(tree=TREE)
def test_any_bundle_round_trips_through_its_archive(tree: Tree) -> None:
    with scratch() as d:
        root = Path(d)
        bundle = freeze(write_tree(root / "src", tree), root / "cache")
        archive = create_bundle_archive(bundle.path, root / "b.tar")
        out = extract_bundle_archive(archive, root / "out")
        assert compute_digest(out) == bundle.digest
        assert tree_of(out / "inputs") == tree_of(bundle.path / "inputs")


def test_extraction_needs_a_fresh_folder(
    attempt: tuple[FrozenBundle, Path], tmp_path: Path
) -> None:
    bundle, _ = attempt
    archive = create_bundle_archive(bundle.path, tmp_path / "bundle.tar")
    dest = tmp_path / "taken"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(InvalidInput, match="already exists"):
        extract_bundle_archive(archive, dest)
    assert [p.name for p in dest.iterdir()] == ["keep.txt"]


def test_extraction_refuses_a_file_that_is_not_an_archive(tmp_path: Path) -> None:
    archive = tmp_path / "bundle.tar"
    archive.write_bytes(b"this is not a tar file at all" * 40)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(InvalidInput, match="not a readable bundle archive"):
        extract_bundle_archive(archive, out / "bundle")
    assert list(out.iterdir()) == []


# --- crafted archives ---------------------------------------------------------------------------


def member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o644
    if kind == tarfile.CHRTYPE:
        info.devmajor, info.devminor = 1, 3
    return info


def craft(path: Path, *members: tarfile.TarInfo) -> Path:
    """An archive whose first members are harmless, followed by `members`."""
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for info in (member("job.json"), member("inputs", tarfile.DIRTYPE), *members):
            data = b"{}\n" if info.isreg() else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


CRAFTED: dict[str, Callable[[], list[tarfile.TarInfo]]] = {
    "absolute path": lambda: [member("/tmp/orbit-evil.txt")],
    "dot-dot path": lambda: [member("../orbit-evil.txt")],
    "dot-dot inside a path": lambda: [member("inputs/../../orbit-evil.txt")],
    "absolute symlink": lambda: [member("inputs/passwd", tarfile.SYMTYPE, "/etc/passwd")],
    "relative symlink out": lambda: [member("inputs/up", tarfile.SYMTYPE, "../../x")],
    "symlink to the parent": lambda: [member("up", tarfile.SYMTYPE, "..")],
    "hard link to a stranger": lambda: [member("inputs/hl", tarfile.LNKTYPE, "etc/passwd")],
    "hard link before its target": lambda: [
        member("inputs/hl", tarfile.LNKTYPE, "inputs/later.txt"),
        member("inputs/later.txt"),
    ],
    "character device": lambda: [member("inputs/null", tarfile.CHRTYPE)],
    "block device": lambda: [member("inputs/disk", tarfile.BLKTYPE)],
    "fifo": lambda: [member("inputs/pipe", tarfile.FIFOTYPE)],
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_extraction_refuses_an_unsafe_archive_and_writes_nothing(case: str, tmp_path: Path) -> None:
    members = CRAFTED[case]()
    archive = craft(tmp_path / "evil.tar", *members)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UnsafeArchive) as err:
        extract_bundle_archive(archive, out / "bundle")
    assert isinstance(err.value, InvalidInput)
    assert f"'{members[0].name}'" in str(err.value)
    assert not (out / "bundle").exists()
    assert list(out.iterdir()) == []
    assert not Path("/tmp/orbit-evil.txt").exists()
    assert not (tmp_path / "orbit-evil.txt").exists()


def test_extraction_refuses_a_link_that_leaves_through_another_link(tmp_path: Path) -> None:
    """`a -> .` is harmless, but through it `a/a/up -> ..` lands outside: refused by name,
    and nothing is left behind either."""
    archive = craft(
        tmp_path / "evil.tar",
        member("inputs/a", tarfile.SYMTYPE, "."),
        member("inputs/a/a/up", tarfile.SYMTYPE, ".."),
    )
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(InvalidInput, match="'inputs/a/a/up': its path passes through a link"):
        extract_bundle_archive(archive, out / "bundle")
    assert list(out.iterdir()) == []


def test_extraction_refuses_live_state_and_foreign_top_level_parts(tmp_path: Path) -> None:
    for name in ("runtime/result.json", "artifacts/model.bin", "etc/passwd"):
        archive = craft(tmp_path / "x.tar", member(name))
        with pytest.raises(InvalidInput, match=r"holds only job\.json, inputs, scripts"):
            extract_bundle_archive(archive, tmp_path / "bundle")
        assert not (tmp_path / "bundle").exists()


def test_extraction_checks_the_digest_when_given(tmp_path: Path) -> None:
    bundle = freeze_bundle(job(), [], tmp_path / "cache")
    archive = create_bundle_archive(bundle.path, tmp_path / "b.tar")
    assert compute_digest(extract_bundle_archive(archive, tmp_path / "ok", bundle.digest)) == (
        bundle.digest
    )
    with pytest.raises(InvalidInput, match="does not match bundle"):
        extract_bundle_archive(archive, tmp_path / "bad", "0" * 64)
    assert not (tmp_path / "bad").exists()


def test_extraction_keeps_links_that_stay_inside(tmp_path: Path) -> None:
    archive = craft(
        tmp_path / "fine.tar",
        member("inputs/real.txt"),
        member("inputs/hard.txt", tarfile.LNKTYPE, "inputs/real.txt"),
        member("inputs/soft.txt", tarfile.SYMTYPE, "real.txt"),
    )
    out = extract_bundle_archive(archive, tmp_path / "bundle")
    assert (out / "inputs" / "hard.txt").read_text() == "{}\n"
    assert os.readlink(out / "inputs" / "soft.txt") == "real.txt"
    assert stat.S_ISDIR((out / "runtime").stat().st_mode)
    assert stat.S_ISDIR((out / "artifacts").stat().st_mode)


# --- freezing inputs already on this disk (what a client sent) --------------------------------


@FAST
@given(tree=TREE, with_link=st.booleans())
def test_a_linked_freeze_is_the_freeze_of_the_same_job_and_inputs(
    tree: Tree, with_link: bool
) -> None:
    """What the server freezes from inputs it holds (bundle_link.freeze_linked: the digest
    counted before anything is written, the wrapper linked from one folder) is what
    freeze_bundle makes of the same job and files: the same digest, the same folder, and
    inputs_digest names its inputs/ as the bundle's digest counts them."""
    from orbit.core.execution.bundle import inputs_digest
    from orbit.core.execution.bundle_link import freeze_linked

    with scratch() as tmp:
        inputs = write_tree(Path(tmp) / "gathered" / "inputs", tree, random.Random(7))
        if with_link:
            os.symlink(next(iter(tree)), inputs / "link.txt")
        (inputs / "wd").mkdir(exist_ok=True)  # as a client gathers them: the workdir too
        made = freeze_bundle(job(workdir="wd"), (), Path(tmp) / "a", lambda i: copy_in(inputs, i))
        memo: dict[tuple[int, int, int, int], str] = {}
        named, _ = inputs_digest(inputs, memo)
        linked = freeze_linked(job(workdir="wd"), inputs, Path(tmp) / "b", memo)
        assert linked.digest == made.digest == compute_digest(linked.path)
        assert tree_of(linked.path) == tree_of(made.path)
        assert inputs_digest(made.path / "inputs")[0] == named != made.digest
        # again: the bundle cached is the answer, nothing is written
        before = sorted(p.name for p in (Path(tmp) / "b").iterdir())
        assert freeze_linked(job(workdir="wd"), inputs, Path(tmp) / "b", {}) == linked
        assert sorted(p.name for p in (Path(tmp) / "b").iterdir()) == before
        # another job over the same files shares their inodes and the wrapper's
        other = freeze_linked(job(workdir="wd", env={"SEED": "8"}), inputs, Path(tmp) / "b", {})
        assert other.digest != linked.digest
        for rel in ("scripts/orbit_wrapper.py", f"inputs/{next(iter(tree))}"):
            assert os.stat(other.path / rel).st_ino == os.stat(linked.path / rel).st_ino


def copy_in(source: Path, inputs: Path) -> None:
    import shutil

    shutil.copytree(source, inputs, symlinks=True, dirs_exist_ok=True)
