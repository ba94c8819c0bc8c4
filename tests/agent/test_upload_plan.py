"""What the agent says of an ended attempt's files: complete once all it may send without
`orbit collect` is sent, and never while files its wrapper's manifest names are gone from
the folder (a work dir wiped while a report was being built: collect must hear that the
node lost them, not find them missing after a "complete")."""

from __future__ import annotations

import json
from pathlib import Path

from orbit.agent.files import FileState, plan_chunks


def ended_attempt(tmp_path: Path, names: list[str]) -> Path:
    folder = tmp_path / "a1"
    (folder / "runtime").mkdir(parents=True)
    (folder / "runtime" / "result.json").write_text('{"state": "succeeded"}')
    artifacts = folder / "artifacts"
    artifacts.mkdir()
    for name in names:
        (artifacts / name).write_text(name)
    manifest = {"files": [{"path": name, "size": len(name), "sha256": "x"} for name in names]}
    (artifacts / "manifest.json").write_text(json.dumps(manifest))
    return folder


def sent_until_done(folder: Path) -> bool:
    files: dict[str, FileState] = {}
    for _ in range(5):
        chunks, complete, _used = plan_chunks(folder, files, 1 << 20, ended=True, large=True)
        for chunk in chunks:
            files[chunk.path].sent(chunk)
        if not chunks:
            return complete
    raise AssertionError("still sending")


def test_an_ended_attempt_with_every_file_of_its_manifest_is_complete(tmp_path: Path) -> None:
    assert sent_until_done(ended_attempt(tmp_path, ["a.txt", "b.txt"]))


def test_files_of_its_manifest_gone_from_the_folder_are_not_complete(tmp_path: Path) -> None:
    folder = ended_attempt(tmp_path, ["a.txt", "b.txt"])
    (folder / "artifacts" / "b.txt").unlink()  # the folder being wiped
    assert not sent_until_done(folder)


def test_a_manifest_that_is_not_the_wrappers_says_nothing(tmp_path: Path) -> None:
    folder = ended_attempt(tmp_path, ["a.txt"])
    (folder / "artifacts" / "manifest.json").write_text("written by the task")
    assert sent_until_done(folder)


def test_a_file_the_agent_never_sends_does_not_hold_it_back(tmp_path: Path) -> None:
    """A name like the wrapper's own temporary files is never listed, so never sent: named in
    the manifest (a task left one), it must not keep the attempt from being complete."""
    assert sent_until_done(ended_attempt(tmp_path, ["a.txt", "state.json.tmp-123"]))
