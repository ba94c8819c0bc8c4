"""Storage through the CLI on local runs, embedded and against a real `orbit server` (the same
commands, the same figures): collect moves only what the destination lacks, usage says what is
on disk, delete removes a run's bytes and keeps its record; embedded, `orbit gc` applies the
rules of $ORBIT_HOME/storage.yaml."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.cli import test_cli
from tests.cli.test_cli import orbit, orbit_json
from tests.helpers import write_spec

env = test_cli.env  # the fixture: each test embedded, then against a server

CHECKPOINTS = (
    "mkdir -p $ORBIT_ARTIFACTS_DIR/checkpoints; for i in 1 2 3 4; do "
    "head -c 50000 /dev/urandom > $ORBIT_ARTIFACTS_DIR/checkpoints/step-$i.pt; done; echo ok"
)


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def finished_run(env: dict[str, str], folder: Path, command: str = CHECKPOINTS) -> dict:  # type: ignore[type-arg]
    spec = write_spec(
        folder, name=f"spec-{len(list(folder.glob('*.yaml')))}.yaml", task={"command": command}
    )
    run = orbit_json(env, "submit", str(spec), "--wait")
    assert run["state"] == "succeeded", run
    return dict(run)


def test_collect_twice_moves_nothing_the_second_time_and_usage_is_the_disk(
    env: dict[str, str], tmp_path: Path
) -> None:
    run = finished_run(env, tmp_path)
    dest = tmp_path / "out"
    first = orbit_json(env, "collect", run["id"], "--dest", str(dest))
    assert first["verified"] is True and first["moved"] == first["bytes"] > 200_000
    second = orbit(env, "collect", run["id"], "--dest", str(dest))
    assert f"{first['files']} files, {first['bytes']} bytes (0 moved)" in second.stdout
    assert orbit_json(env, "collect", run["id"], "--dest", str(dest))["moved"] == 0
    # usage: the attempt's folder and the bundle, as on disk, for its user and experiment
    home = Path(env["ORBIT_HOME"])
    attempt = run["attempts"][-1]["id"]
    found = orbit_json(env, "usage")
    row = {e["name"]: e for e in found["experiments"]}["exp"]
    assert row["artifacts_bytes"] == disk_bytes(home / "work" / attempt)
    assert row["bundles_bytes"] == disk_bytes(home / "bundles" / run["bundle"]["digest"])
    assert row["runs"] == 1 and found["artifacts_bytes"] == row["artifacts_bytes"]
    table = orbit(env, "usage").stdout
    assert table.splitlines()[0].split() == ["USER", "RUNS", "ARTIFACTS", "BUNDLES", "TOTAL"]


def test_delete_removes_the_bytes_keeps_the_record_and_refuses_what_is_pinned(
    env: dict[str, str], tmp_path: Path
) -> None:
    run = finished_run(env, tmp_path)
    home = Path(env["ORBIT_HOME"])
    work = home / "work" / run["attempts"][-1]["id"]
    bundle = home / "bundles" / run["bundle"]["digest"]
    orbit(env, "runs", "pin", run["id"])
    refused = orbit(env, "runs", "delete", run["id"], check=False)
    assert refused.returncode == 2 and "is pinned" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and work.is_dir()
    orbit(env, "runs", "unpin", run["id"])
    dry = orbit_json(env, "runs", "delete", run["id"], "--dry-run")
    assert dry["bytes"] == disk_bytes(work) + disk_bytes(bundle) and work.is_dir()
    shown = orbit(env, "runs", "delete", run["id"]).stdout
    assert "removed 2 on the server" in shown, shown
    assert not work.exists() and not bundle.exists()
    # the record and the audit trail stay, marked
    view = orbit_json(env, "runs", "show", run["id"])
    assert view["state"] == "succeeded" and view["storage"]["deleted_at"]
    assert "deleted" in orbit(env, "runs", "show", run["id"]).stdout
    actions = [e["action"] for e in orbit_json(env, "audit", "--run", run["id"])]
    assert {"run.pinned", "run.unpinned", "run.deleted"} <= set(actions)
    refused = orbit(env, "collect", run["id"], "--dest", str(tmp_path / "x"), check=False)
    assert refused.returncode == 2 and "was deleted" in refused.stderr
    refused = orbit(env, "runs", "delete", "run-nosuchrun", check=False)
    assert refused.returncode == 2 and "unknown run" in refused.stderr


def test_embedded_gc_applies_storage_yaml(orbit_home: Path, tmp_path: Path) -> None:
    here = {
        **os.environ,
        "ORBIT_HOME": str(orbit_home),
        "ORBIT_DATABASE_URL": f"sqlite:///{tmp_path / 'orbit.db'}",
        "COLUMNS": "200",
    }
    run = finished_run(here, tmp_path)
    orbit_home.mkdir(parents=True, exist_ok=True)
    (orbit_home / "storage.yaml").write_text("retention:\n  keep_checkpoints: 1\n")
    dry = orbit_json(here, "gc", "--dry-run")
    paths = sorted(r["path"].rsplit("/", 1)[-1] for r in dry["removals"])
    assert paths == ["step-1.pt", "step-2.pt", "step-3.pt"] and dry["bytes"] == 150_000
    done = orbit_json(here, "gc")
    assert done["bytes"] == 150_000
    checkpoints = orbit_home / "work" / run["attempts"][-1]["id"] / "artifacts" / "checkpoints"
    assert [p.name for p in checkpoints.iterdir()] == ["step-4.pt"]
    collected = orbit_json(here, "collect", run["id"], "--dest", str(tmp_path / "out"))
    assert collected["verified"] is True and len(collected["removed"]) == 3
    # a bad rule: one line naming the file and the field, nothing removed
    (orbit_home / "storage.yaml").write_text("retention:\n  keep_checkpoint: 1\n")
    bad = orbit(here, "gc", check=False)
    assert bad.returncode == 2 and "storage.yaml" in bad.stderr and "keep_checkpoint" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    assert json.loads(orbit(here, "usage", "--json").stdout)["artifacts_bytes"] > 0
