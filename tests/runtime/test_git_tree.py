"""The git tree id of a folder, computed without git, against git's own for the same commit:
file names that sort differently as folders, executable files, links, nested and empty
folders, Python's caches; and which files changed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from orbit.runtime import git_tree


def git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
    }
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, check=True)
    return done.stdout.decode().strip()


def committed(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "repo"
    for rel, text in {  # "a" is a folder: "a.b" and "a-b" sort around "a/"
        "a.b": "x",
        "a-b": "y",
        "a/inner.py": "print(1)\n",
        "a/deeper/z.txt": "",
        "environments/SWE/env.py": "class Actor: ...\n",
        "README.md": "# upstream\n",
    }.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    (repo / "run.sh").write_text("#!/bin/sh\n")
    (repo / "run.sh").chmod(0o755)
    (repo / "link").symlink_to("a/inner.py")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    (repo / "empty").mkdir()  # not in git: not in the tree either
    (repo / "a" / "__pycache__").mkdir()  # what an import leaves: not upstream's
    (repo / "a" / "__pycache__" / "inner.cpython-311.pyc").write_bytes(b"\0")
    return repo, git(repo, "rev-parse", "HEAD^{tree}")


def test_the_tree_id_is_gits_own(tmp_path: Path) -> None:
    repo, tree = committed(tmp_path)
    assert git_tree.tree_id(str(repo)) == tree


def test_any_change_gives_another_id_and_the_files_say_which(tmp_path: Path) -> None:
    repo, tree = committed(tmp_path)
    before = git_tree.file_hashes(str(repo))
    assert "a/__pycache__/inner.cpython-311.pyc" not in before
    (repo / "environments" / "SWE" / "env.py").write_text("class Actor: patched\n")
    (repo / "a.b").chmod(0o755)
    (repo / "new.txt").write_text("")
    (repo / "README.md").unlink()
    assert git_tree.tree_id(str(repo)) != tree
    assert git_tree.changed_files(before, git_tree.file_hashes(str(repo))) == (
        "README.md",
        "a.b",
        "environments/SWE/env.py",
        "new.txt",
    )
