"""The parts of storage that are plain functions over folders: collect's wire format between the
server's copy and a destination (what differs, a cut transfer resumed, a damaged one refused),
which checkpoints a rule removes, and per-experiment rules over the defaults."""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
import time
from pathlib import Path

import pytest

from orbit.client.collect import Destination
from orbit.core.storage.checkpoints import checkpoints, surplus
from orbit.core.storage.wire import Held, listing, tar_stream, to_send
from orbit.model.errors import InvalidInput
from orbit.model.retention import Retention, load_storage_config


def attempt(root: Path, files: dict[str, bytes]) -> Held:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return Held(roots=[("", root)])


def collect(held: Held, dest: Path, cut: int | None = None) -> Destination:
    """One collect of `held` into `dest`, its stream cut after `cut` bytes if asked."""
    here = Destination(dest)
    have, partial = here.have()
    stream = b"".join(tar_stream(to_send(listing(held), have, partial)))
    with contextlib.suppress(tarfile.ReadError):  # a cut stream: what arrived stays
        here.receive(io.BytesIO(stream if cut is None else stream[:cut]))
    here.save()
    return here


def test_only_what_differs_moves_and_a_cut_file_goes_on_from_its_last_byte(
    tmp_path: Path,
) -> None:
    big = os.urandom(600_000)
    held = attempt(tmp_path / "copy", {"a.txt": b"a" * 10, "w/big.bin": big})
    dest = tmp_path / "dest"
    first = collect(held, dest, cut=300_000)  # cut inside big.bin
    assert (dest / "a.txt").read_bytes() == b"a" * 10
    part = dest / ".orbit-collect" / "partial" / "w" / "big.bin"
    begun = part.stat().st_size
    assert 0 < begun < 600_000 and first.moved == 10 + begun
    second = collect(held, dest)
    assert second.moved == 600_000 - begun
    assert (dest / "w" / "big.bin").read_bytes() == big and not part.exists()
    assert first.moved + second.moved == 600_010
    assert collect(held, dest).moved == 0  # unchanged: nothing
    (dest / "a.txt").write_bytes(b"b" * 10)  # changed here, same size: sent again, only it
    assert collect(held, dest).moved == 10 and (dest / "a.txt").read_bytes() == b"a" * 10


def test_a_resumed_file_whose_start_differs_is_refused_not_kept(tmp_path: Path) -> None:
    held = attempt(tmp_path / "copy", {"w.bin": os.urandom(200_000)})
    part = tmp_path / "dest" / ".orbit-collect" / "partial" / "w.bin"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"not the server's start")
    here = collect(held, tmp_path / "dest")
    assert here.problems == ["w.bin: arrived damaged (not the server's copy); collect again"]
    assert not (tmp_path / "dest" / "w.bin").exists() and not part.exists()
    assert collect(held, tmp_path / "dest").moved == 200_000  # whole, the next time


def test_keep_n_removes_the_oldest_never_the_protected_nor_what_runs_and_is_fresh(
    tmp_path: Path,
) -> None:
    arts = tmp_path / "artifacts"
    for step in (100, 200, 300):
        (arts / "out" / f"checkpoint-{step}").mkdir(parents=True)
    (arts / "checkpoints").mkdir()
    (arts / "checkpoints" / "step-50.pt").write_bytes(b"x")
    (arts / "checkpoints" / "step-400.pt.tmp").write_bytes(b"x")  # being written
    found = checkpoints(arts, "att-1")
    assert [c.relpath for c in found] == [
        "checkpoints/step-50.pt",
        "out/checkpoint-100",
        "out/checkpoint-200",
        "out/checkpoint-300",
    ]
    later = time.time() + 3600
    gone = surplus(found, 2, set(), set(), now=later)
    assert [c.relpath for c in gone] == ["out/checkpoint-100", "checkpoints/step-50.pt"]
    protected = {("att-1", "out/checkpoint-100")}
    assert [c.relpath for c in surplus(found, 2, protected, set(), now=later)] == [
        "checkpoints/step-50.pt"
    ]
    assert surplus(found, 2, set(), {"att-1"}) == []  # running, and just written


def test_an_experiments_rule_replaces_only_the_keys_it_gives(tmp_path: Path) -> None:
    path = tmp_path / "storage.yaml"
    path.write_text(
        "retention:\n  keep_checkpoints: 3\n  artifacts_days: 30\n  experiments:\n"
        "    sweeps: {artifacts_days: 7}\n    keep: {artifacts_days: null}\n"
    )
    rules = load_storage_config(path).retention
    assert rules.for_experiment("sweeps").model_dump() == {
        "keep_checkpoints": 3,
        "artifacts_days": 7,
    }
    assert rules.for_experiment("keep").artifacts_days is None
    assert rules.for_experiment("other").artifacts_days == 30
    assert Retention().empty and not rules.empty
    path.write_text("retention:\n  keep_checkpoints: 0\n")
    with pytest.raises(InvalidInput, match=r"storage.yaml: retention.keep_checkpoints"):
        load_storage_config(path)
