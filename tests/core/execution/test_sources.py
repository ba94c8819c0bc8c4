"""Git sources pinned to a commit, and the provenance manifest, on real repositories."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import ValidationError

from orbit.core.execution.sources import (
    SourceSpec,
    is_dirty,
    parse_sources,
    place_sources,
    read_provenance,
    snapshot_workdir,
    stage_source,
    write_provenance,
)
from orbit.model.errors import InvalidInput

SENTENCE = "ref must be an exact 40-character commit hash"


@pytest.fixture(autouse=True)
def _hermetic_git(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No system or user git config, and no repository above tmp_path is ever found."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(name, raising=False)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=True)
    return done.stdout.decode().strip()


def init_repo(repo: Path) -> Path:
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "Test")
    git(repo, "config", "user.email", "test@example.invalid")
    git(repo, "config", "commit.gpgsign", "false")
    return repo


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@dataclass
class Upstream:
    repo: Path
    first: str
    second: str


@pytest.fixture
def upstream(tmp_path: Path) -> Upstream:
    """Two commits: the second changes env.py, removes removed.txt and adds later.txt."""
    repo = init_repo(tmp_path / "up")
    (repo / "env.py").write_text("VERSION = 1\n")
    (repo / "removed.txt").write_text("gone later\n")
    (repo / "bin").mkdir()
    (repo / "bin" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (repo / "bin" / "run.sh").chmod(0o755)
    (repo / "data.bin").write_bytes(bytes(range(256)))
    (repo / "link.py").symlink_to("env.py")
    # git archive would drop or rewrite these; the staged tree must not
    (repo / ".gitattributes").write_text("ignored.txt export-ignore\nsubst.txt export-subst\n")
    (repo / "ignored.txt").write_text("still staged\n")
    (repo / "subst.txt").write_text("$Format:%H$\n")
    first = commit_all(repo, "first")
    git(repo, "tag", "v1")
    git(repo, "branch", "old")
    (repo / "env.py").write_text("VERSION = 2\n")
    (repo / "removed.txt").unlink()
    (repo / "later.txt").write_text("later\n")
    second = commit_all(repo, "second")
    return Upstream(repo, first, second)


def spec(up: Upstream, ref: str, path: str = "vendor/env") -> SourceSpec:
    return SourceSpec(repo=str(up.repo), ref=ref, path=path)


def files_under(root: Path) -> dict[str, bytes | str]:
    """Every file (content) and link (target) under root, by relative path."""
    out: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = os.readlink(path)
        elif path.is_file():
            out[rel] = path.read_bytes()
    return out


# --- staging a pinned commit ------------------------------------------------------------------


def test_pinned_commit_stages_exactly_its_tree(upstream: Upstream, tmp_path: Path) -> None:
    staged = stage_source(spec(upstream, upstream.first), 0, tmp_path, tmp_path / "s", False)
    tree = staged.tree_dir
    assert tree.is_relative_to(tmp_path / "s")
    assert staged.dest == "vendor/env" and staged.diff is None and staged.index == 0
    listed = git(upstream.repo, "ls-tree", "-r", "--name-only", upstream.first).splitlines()
    assert sorted(files_under(tree)) == sorted(listed)
    assert (tree / "env.py").read_text() == "VERSION = 1\n"  # the later change is absent
    assert (tree / "removed.txt").is_file()  # removed later, present at this commit
    assert not (tree / "later.txt").exists()
    assert os.access(tree / "bin" / "run.sh", os.X_OK)
    assert not os.access(tree / "env.py", os.X_OK)
    assert (tree / "data.bin").read_bytes() == bytes(range(256))
    assert os.readlink(tree / "link.py") == "env.py"
    assert (tree / "ignored.txt").read_text() == "still staged\n"
    assert (tree / "subst.txt").read_text() == "$Format:%H$\n"


def test_provenance_names_repo_commit_and_tree(upstream: Upstream, tmp_path: Path) -> None:
    staged = stage_source(spec(upstream, upstream.first), 0, tmp_path, tmp_path / "s", False)
    assert staged.provenance == {
        "schema_version": 1,
        "kind": "git",
        "repo": str(upstream.repo),
        "repo_path": str(upstream.repo),
        "origin_url": None,
        "commit": upstream.first,
        "tree": git(upstream.repo, "rev-parse", f"{upstream.first}^{{tree}}"),
        "path": "vendor/env",
        "dirty": False,
        "diff_sha256": None,
        "dirty_paths": [],
        "untracked_not_staged": [],
        "submodules_not_staged": [],
    }


def test_origin_url_is_recorded_without_credentials(upstream: Upstream, tmp_path: Path) -> None:
    url = "https://user:s3cret@example.invalid/org/env.git"
    git(upstream.repo, "remote", "add", "origin", url)
    staged = stage_source(spec(upstream, upstream.second), 0, tmp_path, tmp_path / "s", False)
    assert staged.provenance["origin_url"] == "https://example.invalid/org/env.git"
    assert staged.provenance["repo"] == "https://example.invalid/org/env.git"
    assert staged.provenance["repo_path"] == str(upstream.repo)


def test_relative_repo_is_relative_to_the_spec_folder(upstream: Upstream, tmp_path: Path) -> None:
    relative = SourceSpec(repo="up", ref=upstream.second.upper(), path="env")
    assert relative.ref == upstream.second  # upper case is accepted, and normalised
    staged = stage_source(relative, 0, tmp_path, tmp_path / "s", False)
    assert (staged.tree_dir / "later.txt").is_file()


@pytest.mark.parametrize("ref", ["main", "old", "v1", "HEAD", "short", "41", "", "g" * 40])
def test_anything_but_a_full_commit_hash_is_refused(upstream: Upstream, ref: str) -> None:
    value = {"short": upstream.first[:7], "41": upstream.first + "0"}.get(ref, ref)
    with pytest.raises(ValidationError, match=SENTENCE):
        spec(upstream, value)
    with pytest.raises(InvalidInput, match=rf"^task\.sources\.0\.ref: {SENTENCE}, not '{value}'$"):
        parse_sources([{"repo": str(upstream.repo), "ref": value, "path": "env"}])


def test_unknown_commit_is_refused(upstream: Upstream, tmp_path: Path) -> None:
    missing = "0123456789" * 4
    with pytest.raises(InvalidInput, match=rf"^task\.sources\.2\.ref: commit {missing} not found"):
        stage_source(spec(upstream, missing), 2, tmp_path, tmp_path / "s", False)


def test_an_object_that_is_not_a_commit_is_refused(upstream: Upstream, tmp_path: Path) -> None:
    blob = git(upstream.repo, "rev-parse", f"{upstream.first}:env.py")
    with pytest.raises(InvalidInput, match=rf"^task\.sources\.0\.ref: {blob} is a blob, not a"):
        stage_source(spec(upstream, blob), 0, tmp_path, tmp_path / "s", False)


def test_a_repo_that_is_not_a_git_checkout_is_refused(upstream: Upstream, tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "file.txt").write_text("x")
    (upstream.repo / "bin").mkdir(exist_ok=True)
    cases = {
        "plain": "is not a git repository",
        "missing": "does not exist",
        "file.txt": "is not a folder",
        "up/bin": f"is inside the git repository {upstream.repo}",
    }
    for repo, message in cases.items():
        bad = SourceSpec(repo=repo, ref=upstream.first, path="env")
        expected = rf"^task\.sources\.0\.repo: {re.escape(str(tmp_path))}.*{re.escape(message)}"
        with pytest.raises(InvalidInput, match=expected):
            stage_source(bad, 0, tmp_path, tmp_path / "s", False)


@pytest.mark.parametrize(
    "path", ["", ".", "./", "/abs", "../up", "a/../../b", "a\\b", "workdir", "workdir/x", ".orbit"]
)
def test_bad_destination_paths_are_refused(path: str) -> None:
    with pytest.raises(InvalidInput, match=r"^task\.sources\.0\.path: "):
        parse_sources([{"repo": "up", "ref": "a" * 40, "path": path}])


def test_parse_sources_normalises_and_refuses_overlaps(upstream: Upstream) -> None:
    item = {"repo": str(upstream.repo), "ref": upstream.first}
    specs = parse_sources([{**item, "path": "./vendor//env/"}, {**item, "path": "other"}])
    assert [s.path for s in specs] == ["vendor/env", "other"]
    with pytest.raises(InvalidInput, match=r"^task\.sources\.1\.path: 'vendor' overlaps task\."):
        parse_sources([{**item, "path": "vendor/env"}, {**item, "path": "vendor"}])
    with pytest.raises(InvalidInput, match=r"^task\.sources\.0\.path: 'code/x' overlaps inputs/"):
        parse_sources([{**item, "path": "code/x"}], reserved=["code"])
    with pytest.raises(InvalidInput, match=r"^task\.sources\.0\.branch: unknown key"):
        parse_sources([{**item, "path": "env", "branch": "main"}])
    with pytest.raises(InvalidInput, match=r"^task\.sources\.0: expected a mapping"):
        parse_sources([cast(Any, "up")])
    with pytest.raises(InvalidInput, match=r"^task\.sources\.0\.repo: Field required"):
        parse_sources([{"ref": upstream.first, "path": "env"}])


def test_a_link_leaving_the_tree_is_refused(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "up")
    (repo / "escape").symlink_to("../../outside")
    commit = commit_all(repo, "link")
    bad = SourceSpec(repo="up", ref=commit, path="env")
    with pytest.raises(InvalidInput, match=r"^task\.sources\.0\.ref: escape in .* links outside"):
        stage_source(bad, 0, tmp_path, tmp_path / "s", False)


def test_submodules_are_recorded_not_staged(upstream: Upstream, tmp_path: Path) -> None:
    gitlink = f"160000,{upstream.first},sub/module"
    git(upstream.repo, "update-index", "--add", "--cacheinfo", gitlink)
    git(upstream.repo, "commit", "-q", "-m", "submodule")
    head = git(upstream.repo, "rev-parse", "HEAD")
    (upstream.repo / "sub" / "module").mkdir(parents=True)  # as an uninitialised submodule is
    staged = stage_source(spec(upstream, head), 0, tmp_path, tmp_path / "s", False)
    assert staged.provenance["submodules_not_staged"] == ["sub/module"]
    assert list((staged.tree_dir / "sub" / "module").iterdir()) == []


# --- dirty checkouts --------------------------------------------------------------------------


def make_dirty(up: Upstream) -> None:
    (up.repo / "env.py").write_text("VERSION = 'local'\n")  # modified
    (up.repo / "later.txt").unlink()  # deleted
    (up.repo / "data.bin").write_bytes(bytes(range(255, -1, -1)))  # binary change
    (up.repo / "staged.txt").write_text("added\n")
    git(up.repo, "add", "staged.txt")  # new, in the index
    (up.repo / "new.txt").write_text("untracked\n")


def test_a_dirty_checkout_is_refused_naming_the_paths(upstream: Upstream, tmp_path: Path) -> None:
    make_dirty(upstream)
    with pytest.raises(InvalidInput) as caught:
        stage_source(spec(upstream, upstream.second), 0, tmp_path, tmp_path / "s", False)
    assert str(caught.value) == (
        f"task.sources.0.repo: {upstream.repo} has uncommitted changes "
        "(data.bin, env.py, later.txt, new.txt, staged.txt); commit them, "
        "or pass --allow-dirty to record the diff in the bundle"
    )
    assert not (tmp_path / "s").exists()  # refused before anything was written


def test_a_long_list_of_dirty_paths_is_cut_short(upstream: Upstream, tmp_path: Path) -> None:
    for n in range(13):
        (upstream.repo / f"u{n:02}.txt").write_text("x")
    with pytest.raises(InvalidInput, match=r"\(u00\.txt, .*, u09\.txt, and 3 more\); commit"):
        stage_source(spec(upstream, upstream.second), 0, tmp_path, tmp_path / "s", False)


def test_allow_dirty_stages_and_records_the_diff(upstream: Upstream, tmp_path: Path) -> None:
    make_dirty(upstream)
    staged = stage_source(spec(upstream, upstream.second), 0, tmp_path, tmp_path / "s", True)
    tree = staged.tree_dir
    assert (tree / "env.py").read_text() == "VERSION = 'local'\n"
    assert not (tree / "later.txt").exists()
    assert (tree / "data.bin").read_bytes() == bytes(range(255, -1, -1))
    assert (tree / "staged.txt").read_text() == "added\n"
    assert not (tree / "new.txt").exists()  # untracked files are never staged
    assert os.readlink(tree / "link.py") == "env.py"
    p = staged.provenance
    assert staged.diff and b"GIT binary patch" in staged.diff
    assert p["dirty"] is True and p["commit"] == upstream.second
    assert p["diff_sha256"] == hashlib.sha256(staged.diff).hexdigest()
    assert p["dirty_paths"] == ["data.bin", "env.py", "later.txt", "new.txt", "staged.txt"]
    assert p["untracked_not_staged"] == ["new.txt"]
    # commit + diff reproduces the staged tree in a fresh clone
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(upstream.repo), str(clone))
    subprocess.run(["git", "-C", str(clone), "apply", "-"], input=staged.diff, check=True)
    (clone / "new.txt").unlink(missing_ok=True)
    assert files_under(clone / "bin") == files_under(tree / "bin")
    clone_files = {k: v for k, v in files_under(clone).items() if not k.startswith(".git/")}
    assert clone_files == files_under(tree)


def test_the_diff_is_applied_in_the_tree_even_inside_another_repo(
    upstream: Upstream, tmp_path: Path
) -> None:
    host = init_repo(tmp_path / "host")  # an ORBIT home that happens to be a checkout
    (upstream.repo / "env.py").write_text("VERSION = 'local'\n")
    staged = stage_source(spec(upstream, upstream.second), 0, tmp_path, host / "cache", True)
    assert (staged.tree_dir / "env.py").read_text() == "VERSION = 'local'\n"
    assert not (host / "env.py").exists()


def test_allow_dirty_with_only_untracked_files_has_no_diff(
    upstream: Upstream, tmp_path: Path
) -> None:
    (upstream.repo / "notes.txt").write_text("scratch\n")
    staged = stage_source(spec(upstream, upstream.second), 0, tmp_path, tmp_path / "s", True)
    assert staged.diff is None and staged.provenance["diff_sha256"] is None
    assert staged.provenance["dirty"] is True
    assert staged.provenance["untracked_not_staged"] == ["notes.txt"]
    assert not (staged.tree_dir / "notes.txt").exists()


def test_a_checkout_on_another_commit_stays_clean(upstream: Upstream, tmp_path: Path) -> None:
    """Clean means no uncommitted changes; HEAD may be elsewhere, the pinned tree is staged."""
    git(upstream.repo, "checkout", "-q", "old")
    staged = stage_source(spec(upstream, upstream.second), 0, tmp_path, tmp_path / "s", False)
    assert (staged.tree_dir / "env.py").read_text() == "VERSION = 2\n"
    assert staged.provenance["dirty"] is False


# --- the submitted workdir --------------------------------------------------------------------


def test_snapshot_of_a_clean_checkout(upstream: Upstream) -> None:
    assert snapshot_workdir(upstream.repo) == {
        "schema_version": 1,
        "kind": "git",
        "repo_path": str(upstream.repo),
        "origin_url": None,
        "commit": upstream.second,
        "dirty": False,
        "dirty_paths": [],
        "dirty_paths_scope": "repository",
        "subdir": ".",
    }


def test_snapshot_of_a_dirty_subfolder(upstream: Upstream) -> None:
    (upstream.repo / "env.py").write_text("changed\n")
    (upstream.repo / "bin" / "new.sh").write_text("x")
    snap = snapshot_workdir(upstream.repo / "bin")
    assert snap is not None
    assert snap["subdir"] == "bin" and snap["repo_path"] == str(upstream.repo)
    assert snap["dirty"] is True and snap["dirty_paths"] == ["bin/new.sh", "env.py"]
    assert snap["commit"] == upstream.second


def test_snapshot_outside_git_and_without_commits(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    assert snapshot_workdir(tmp_path / "plain") is None
    empty = init_repo(tmp_path / "empty")
    assert snapshot_workdir(empty) is not None
    (empty / "train.py").write_text("print()\n")
    snap = snapshot_workdir(empty)
    assert snap is not None
    assert snap["commit"] is None and snap["dirty"] is True and snap["dirty_paths"] == ["train.py"]


# --- the manifest -----------------------------------------------------------------------------


def test_provenance_round_trip_beside_the_staged_trees(upstream: Upstream, tmp_path: Path) -> None:
    clean = stage_source(
        spec(upstream, upstream.first, "vendor/a"), 0, tmp_path, tmp_path / "s", False
    )
    (upstream.repo / "env.py").write_text("dirty\n")
    dirty = stage_source(spec(upstream, upstream.second, "b"), 1, tmp_path, tmp_path / "s", True)
    bundle = tmp_path / "bundle"
    inputs = bundle / "inputs"
    place_sources(inputs, [clean, dirty])
    before = {d: files_under(inputs / d) for d in ("vendor/a", "b")}
    assert before["vendor/a"] and not clean.tree_dir.exists()
    workdir = snapshot_workdir(upstream.repo)
    write_provenance(inputs, [clean, dirty], workdir)

    assert {d: files_under(inputs / d) for d in ("vendor/a", "b")} == before  # untouched
    manifest = read_provenance(bundle)
    assert manifest is not None
    assert manifest["schema_version"] == 1 and manifest["workdir"] == workdir
    assert manifest["sources"][0] == clean.provenance
    assert manifest["sources"][1] == {**dirty.provenance, "diff_file": ".orbit/sources/1.diff"}
    assert (inputs / ".orbit" / "sources" / "1.diff").read_bytes() == dirty.diff
    assert sorted(p.name for p in (inputs / ".orbit").rglob("*")) == [
        "1.diff",
        "provenance.json",
        "sources",
    ]
    assert is_dirty(manifest)


def test_nothing_to_record_writes_nothing(tmp_path: Path) -> None:
    write_provenance(tmp_path / "inputs", [], None)
    assert not (tmp_path / "inputs").exists()
    assert read_provenance(tmp_path) is None


def test_place_sources_refuses_a_taken_destination(upstream: Upstream, tmp_path: Path) -> None:
    staged = stage_source(spec(upstream, upstream.first, "env"), 3, tmp_path, tmp_path / "s", False)
    (tmp_path / "inputs" / "env").mkdir(parents=True)
    with pytest.raises(InvalidInput, match=r"^task\.sources\.3\.path: inputs/env is taken"):
        place_sources(tmp_path / "inputs", [staged])


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        (None, False),
        ({"schema_version": 1, "sources": [], "workdir": None}, False),
        ({"sources": [{"dirty": False}], "workdir": {"dirty": False}}, False),
        ({"sources": [{"dirty": False}, {"dirty": True}], "workdir": None}, True),
        ({"sources": [], "workdir": {"dirty": True}}, True),
    ],
)
def test_is_dirty(manifest: dict[str, Any] | None, expected: bool) -> None:
    assert is_dirty(manifest) is expected
