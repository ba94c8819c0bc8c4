"""Which checkpoint an attempt left is its newest, by ORBIT's convention (checkpoints/, HF
Trainer's and ms-swift's checkpoint-* folders): what a retry resumes from. The control plane
reads it over an attempt's artifacts (orbit.core.storage.checkpoints, the agent pool's mirror);
it does not travel in bundles, but keeps to python3's standard library like the rest of
runtime/."""

from __future__ import annotations

import contextlib
import glob
import os
import re

_STEP = re.compile(r"(\d+)(?:\.[A-Za-z0-9]+)?$")
_SWIFT_RUN = re.compile(r"^v(\d+)-")  # ms-swift's output_dir/vN-DATE-TIME/checkpoint-N


def _newest_swift_runs(artifacts: str) -> list[str]:
    """In each folder of `artifacts` that holds ms-swift run folders, the newest that has a
    checkpoint: the highest vN by number (v10 after v9; a failed start leaves an empty one)."""
    found: dict[str, tuple[int, str]] = {}
    for run in glob.glob(os.path.join(glob.escape(artifacts), "*", "v*-*")):
        m = _SWIFT_RUN.match(os.path.basename(run))
        if m and glob.glob(os.path.join(glob.escape(run), "checkpoint-*")):
            parent = os.path.dirname(run)
            found[parent] = max(found.get(parent, (-1, "")), (int(m.group(1)), run))
    return [run for _, run in found.values()]


def newest_checkpoint(artifacts: str) -> str | None:
    """The newest checkpoint an attempt left under its artifacts folder, as a path relative to
    it, by ORBIT's convention: an entry of `checkpoints/` (a file or a folder), or a folder
    named `checkpoint-*` up to two levels down (HF Trainer's and ms-swift's
    `output_dir/checkpoint-500`), or a `checkpoint-*` of the newest ms-swift run folder
    (`checkpoints/vN-DATE-TIME/checkpoint-500`). Newest: the highest step number in the
    name, then the latest change; None without one. Where some `checkpoint-*` folders hold
    `trainer_state.json` (HF Trainer's, and so ms-swift's, last file of a save), one without
    it is a save cut short (a stop during it) and is passed over."""
    found: list[tuple[int, float, str]] = []

    def consider(path: str) -> None:
        name = os.path.basename(path)
        if name.startswith(".") or name.endswith((".tmp", ".partial")):
            return  # being written, or left half-written
        m = _STEP.search(name)
        with contextlib.suppress(OSError):
            found.append((int(m.group(1)) if m else -1, os.stat(path).st_mtime, path))

    for entry in glob.glob(os.path.join(glob.escape(artifacts), "checkpoints", "*")):
        if not (_SWIFT_RUN.match(os.path.basename(entry)) and os.path.isdir(entry)):
            consider(entry)
    for run in _newest_swift_runs(artifacts):
        for entry in glob.glob(os.path.join(glob.escape(run), "checkpoint-*")):
            if os.path.isdir(entry):
                consider(entry)
    for depth in ("*", os.path.join("*", "*")):
        pattern = os.path.join(glob.escape(artifacts), depth)
        for entry in glob.glob(pattern):
            if os.path.basename(entry).startswith("checkpoint-") and os.path.isdir(entry):
                consider(entry)
    saves = [f for f in found if os.path.basename(f[2]).startswith("checkpoint-")]
    if any(_saved(f[2]) for f in saves):
        found = [f for f in found if f not in saves or _saved(f[2])]
    if not found:
        return None
    return os.path.relpath(max(found)[2], artifacts)


def _saved(checkpoint: str) -> bool:
    """Whether an HF Trainer checkpoint folder was written to its end (as the swift launcher,
    the workdir's swift_launch.py, reads it too)."""
    return os.path.exists(os.path.join(checkpoint, "trainer_state.json"))
