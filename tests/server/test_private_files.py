"""Files for their owner: what the control plane keeps (the SQLite store and its -wal/-shm, the
bundle cache, local attempts' folders, agent attempts' files, collected artifacts) is readable
by ORBIT's user only, on a real `orbit server` (umask 077) and in embedded mode, where the CLI
keeps the user's umask for what it writes elsewhere but makes its own folders 0700."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from tests.helpers import ORBIT, eventually, orbit, orbit_json, write_spec
from tests.orbit_server import Server

STORE_FILES = ("orbit.db", "orbit.db-wal", "orbit.db-shm")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _open_to_others(root: Path) -> list[str]:
    """Folders under `root` (itself included) that anyone but their owner may enter or list."""
    found = [root, *(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())]
    return [f"{p} {_mode(p):o}" for p in found if _mode(p) & 0o077]


def _under(path: Path, places: tuple[Path, ...]) -> bool:
    return any(path == place or place in path.parents for place in places)


def _store_files(folder: Path) -> dict[str, int]:
    return {name: _mode(folder / name) for name in STORE_FILES if (folder / name).exists()}


def test_what_a_server_keeps_is_its_users_only(orbit_server: Server, tmp_path: Path) -> None:
    admin = orbit_server.env()
    run = orbit_json(admin, "submit", str(write_spec(tmp_path, task={"command": "echo hi"})))
    with orbit_server.client() as http:

        def ended() -> bool:
            attempts = http.get(f"/api/v1/runs/{run['id']}").json()["attempts"]
            return bool(attempts[-1]["state"] == "succeeded")

        eventually(ended)
    # what collect copies out is the caller's to share, as an embedded collect's is
    orbit(admin, "collect", run["id"], "--dest", str(tmp_path / "out"))
    copied = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert copied and all(_mode(p) & 0o044 == 0o044 for p in copied), copied
    home = orbit_server.home
    for name in ("bundles", "work", "artifacts"):
        assert (home / name).is_dir(), name
        assert _open_to_others(home / name) == [], name
    assert not (home / "collected").exists()  # collect serves the one copy, keeps no other
    attempt = home / "work" / f"{run['id']}-1"
    # what the attempt wrote (its bundle's frozen files keep the modes they were frozen with,
    # behind the folders above)
    frozen = (attempt / "job.json", attempt / "scripts", attempt / "inputs")
    made = [p for p in attempt.rglob("*") if p.is_file() and not _under(p, frozen)]
    assert made and [f"{p} {_mode(p):o}" for p in made if _mode(p) & 0o077] == []
    if orbit_server.database_url.startswith("sqlite:///"):
        store = Path(orbit_server.database_url.removeprefix("sqlite:///")).parent
        modes = _store_files(store)
        assert set(modes) >= {"orbit.db", "orbit.db-wal"} and set(modes.values()) == {0o600}


def _embedded(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env.update(ORBIT_HOME=str(home), COLUMNS="200")
    return subprocess.run(
        [*ORBIT, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        umask=0o022,  # a user's usual: what ORBIT keeps must not depend on it
    )


def test_what_the_embedded_cli_keeps_is_its_users_only(tmp_path: Path) -> None:
    home = tmp_path / "new-home"
    spec = write_spec(tmp_path, task={"command": "echo hi"})
    _embedded(home, "submit", str(spec), "--wait")
    assert _mode(home) == 0o700
    for name in ("bundles", "work", "artifacts"):
        assert _mode(home / name) == 0o700, name
    assert set(_store_files(home).values()) == {0o600}, _store_files(home)

    # a store made before (or by hand) is its owner's only again at the next command; what
    # `collect` copies out is the user's, with the user's umask
    (home / "orbit.db").chmod(0o644)
    run_id = _embedded(home, "runs", "list", "--json").stdout.split('"id": "')[1].split('"')[0]
    assert _mode(home / "orbit.db") == 0o600
    _embedded(home, "collect", run_id, "--dest", str(tmp_path / "out"))
    assert _mode(tmp_path / "out") & 0o055 == 0o055
