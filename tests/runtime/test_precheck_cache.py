"""The precheck's cache of installed packages (scripts/orbit_dist_cache.py): real runs whose
interpreter is a real venv into which real pip installs, upgrades, reinstalls and removes a
package between them. Each attempt's record must be what a precheck without the cache writes,
and the cache must have been used where nothing changed (else it would prove nothing)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from orbit.core.control.service import CoreControlService
from orbit.model.models import RunState
from orbit.runtime import dist_cache

from .test_precheck import attempt_dir, make_venv, site_packages, submit, write_task


def wheel(where: Path, name: str, version: str, body: str = "") -> Path:
    """A real wheel of a one-module package, as a build backend writes it."""
    path = where / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f'__version__ = "{version}"\n{body}',
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: orbit-tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for file, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{file},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    with zipfile.ZipFile(path, "w") as zf:
        for file, text in files.items():
            zf.writestr(file, text)
        zf.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


def pip(python: Path, *args: str) -> None:
    """This interpreter's pip acting on the venv's (a venv made without pip of its own)."""
    argv = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    subprocess.run([*argv, *args], check=True, capture_output=True, text=True)


def fresh(python: Path, bundle: Path) -> dict[str, Any]:
    """What the precheck writes with no cache at all, in the same interpreter, same bundle."""
    env = dict(os.environ, ORBIT_PRECHECK_CACHE="off")
    script = bundle / "scripts" / "orbit_precheck.py"
    subprocess.run([str(python), str(script), "--bundle", str(bundle)], env=env, check=True)
    report = json.loads((bundle / "runtime" / "precheck.json").read_text())
    assert isinstance(report, dict)
    return report


def same_record(cached: dict[str, Any], afresh: dict[str, Any]) -> None:
    assert afresh["distributions_cache"] == "off"
    differ = {k for k in cached.keys() | afresh.keys() if cached.get(k) != afresh.get(k)}
    assert differ == {"at", "distributions_cache"}, differ  # the record itself: the same


def test_the_cache_follows_every_install_upgrade_and_removal(
    service: CoreControlService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("ORBIT_PRECHECK_CACHE", str(cache))
    python = make_venv(tmp_path / "venv")
    write_task(tmp_path / "proj")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    site = str(site_packages(tmp_path / "venv"))
    n = iter(range(100))

    def attempt(expect: str) -> list[str]:
        run = submit(
            service,
            tmp_path,
            "python",
            {
                "script": "proj/task.py",
                "args": [str(tmp_path / f"ran-{next(n)}")],
                "interpreter": str(python),
            },
        )
        run = service.wait_for(run.id, timeout_s=60, poll_s=0.05)
        assert run.state is RunState.SUCCEEDED, run.current.message
        bundle = attempt_dir(run)
        report = json.loads((bundle / "runtime" / "precheck.json").read_text())
        same_record(report, fresh(python, bundle))
        assert report["distributions_cache"] == expect, report["distributions_cache"]
        lines = report["distributions"]["lines"]
        assert isinstance(lines, list)
        return lines

    miss, hit = "0 of 1 folders from the cache", "1 of 1 folders from the cache"
    wheel(wheels, "cachedpkg", "1.0")
    wheel(wheels, "cachedpkg", "2.0")
    index = ["--no-index", "--no-deps", "--find-links", str(wheels)]
    pip(python, "install", *index, "cachedpkg==1.0")
    assert attempt(miss) == ["cachedpkg==1.0"]  # installed: read afresh, then cached
    assert attempt(hit) == ["cachedpkg==1.0"]  # nothing changed: from the cache
    assert [p.name for p in cache.iterdir()] and all(
        p.stat().st_mode & 0o777 == 0o600 for p in cache.iterdir()
    )

    pip(python, "install", *index, "--upgrade", "cachedpkg")
    assert attempt(miss) == ["cachedpkg==2.0"]  # upgraded
    assert attempt(hit) == ["cachedpkg==2.0"]

    # the same version again, from a file: pip records where (direct_url.json), and so must
    # the record ("cachedpkg @ file://...")
    other = tmp_path / "other"
    other.mkdir()
    again = wheel(other, "cachedpkg", "2.0", body="CHANGED = True\n")
    pip(python, "install", "--no-index", "--no-deps", "--force-reinstall", str(again))
    lines = attempt(miss)
    assert lines == [f"cachedpkg @ {again.as_uri()}"]
    assert attempt(hit) == lines
    # where it came from, changed in place (as a reinstall that keeps the folder might):
    # the same size, the times put back; its content still tells
    (direct,) = Path(site).glob("cachedpkg-2.0.dist-info/direct_url.json")
    before = direct.stat()
    text = direct.read_text()
    moved = text.replace("/other/", "/elsew/")
    assert len(moved) == len(text) and moved != text
    direct.write_text(moved)
    os.utime(direct, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert attempt(miss) == [f"cachedpkg @ {again.as_uri().replace('/other/', '/elsew/')}"]

    pip(python, "uninstall", "--yes", "cachedpkg")
    assert attempt("0 of 0 folders from the cache") == []  # removed: nothing left to list
    cached = [json.loads(p.read_text())["folder"] for p in cache.iterdir()]
    assert cached == [site]  # the venv's site-packages, the one folder that held packages


def test_a_cache_someone_else_could_write_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache file that claims another listing for a folder is used only when it is the
    user's own and no one else may write it; otherwise the folder is read afresh."""
    folder = tmp_path / "site"
    folder.mkdir()
    info = folder / "real-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: real\nVersion: 1.0\n")
    cache = tmp_path / "cache"
    mark = dist_cache.fingerprint(str(folder))
    assert mark and mark[0][0] == "real-1.0.dist-info"
    forged = [["dist", "forged", "forged==6.6.6"]]
    code = dist_cache.code_mark(__file__)
    assert code is not None
    assert dist_cache.code_mark(str(tmp_path / "gone.py")) is None  # no code to tie it to
    dist_cache.save(str(cache), str(folder), mark, code, forged)
    assert dist_cache.load(str(cache), str(folder), mark, code) == forged  # the user's own

    def read(where: str) -> list[list[str]]:
        return [["dist", "real", "real==1.0"]]

    for mode in (0o720, 0o702):  # the folder writable by the group, or by anyone
        cache.chmod(mode)
        assert dist_cache.load(str(cache), str(folder), mark, code) is None
    cache.chmod(0o700)
    (file,) = cache.iterdir()
    file.chmod(0o622)
    assert dist_cache.load(str(cache), str(folder), mark, code) is None
    file.chmod(0o600)
    # a changed folder does not match the cached fingerprint
    (folder / "real-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: real\nVersion: 1.0\nSummary: more\n"
    )
    changed = dist_cache.fingerprint(str(folder))
    assert changed != mark
    assert dist_cache.load(str(cache), str(folder), changed, code) is None
    # a link in the file's place is not followed, even to a valid entry
    target = tmp_path / "elsewhere.json"
    file.rename(target)
    file.symlink_to(target)
    assert dist_cache.load(str(cache), str(folder), mark, code) is None
    file.unlink()
    target.rename(file)
    assert dist_cache.load(str(cache), str(folder), mark, code) == forged

    monkeypatch.setattr(sys, "path", [str(folder), str(tmp_path / "absent")])
    monkeypatch.setenv("ORBIT_PRECHECK_CACHE", str(cache))
    found = dist_cache.listing(read, __file__)
    assert found == (read(str(folder)), "0 of 1 folders from the cache")
    assert dist_cache.listing(read, __file__) == (
        read(str(folder)),
        "1 of 1 folders from the cache",
    )
    # a cache written by other code (or another interpreter) is not read
    assert dist_cache.load(str(cache), str(folder), changed, code + 1) is None
    # a relative cache folder would land in the task's working directory: none then
    for relative in ("cache", "~/.cache/orbit"):
        monkeypatch.setenv("ORBIT_PRECHECK_CACHE", relative)
        assert dist_cache.listing(read, __file__) is None
    monkeypatch.delenv("ORBIT_PRECHECK_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert dist_cache.where() == str(tmp_path / "home" / ".cache" / "orbit" / "precheck")
