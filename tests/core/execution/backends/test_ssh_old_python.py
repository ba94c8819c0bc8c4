"""The runtime that travels inside bundles on the oldest python3 it promises: a bare rented box
whose only python3 is 3.8 (a real sshd on loopback, its PATH holding the system's tools and that
python3 alone) stages, runs, reports and collects a run like any other. Where no CPython 3.8 is
installed (pyenv's, or python3.8 on PATH), skipped: nothing installs one here on demand."""

from __future__ import annotations

import glob
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.core.execution.backends.test_ssh_host_process import add_host, spec_for
from tests.helpers import orbit, orbit_json
from tests.sshd import SshdFactory, make_tool_dir


def _python38() -> str | None:
    """A real CPython 3.8 binary (pyenv's shim would answer only where pyenv selects 3.8)."""
    found = [
        *sorted(glob.glob("/root/.pyenv/versions/3.8*/bin/python3.8")),
        shutil.which("python3.8"),
    ]
    return next((p for p in found if p and "/shims/" not in p), None)


def test_a_bare_host_whose_python3_is_38_runs_a_job_end_to_end(
    env: dict[str, str], sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    python = _python38()
    if python is None:
        pytest.skip("no CPython 3.8 here (pyenv install 3.8, or python3.8 on PATH)")
    version = subprocess.run([python, "--version"], capture_output=True, text=True).stdout
    assert version.startswith("Python 3.8."), version
    tools = Path(make_tool_dir(tmp_path / "bin"))
    (tools / "python3").symlink_to(python)
    added = add_host(env, "old", sshd_factory(alias="old", path=str(tools)))
    assert added["facts"]["python_version"].startswith("3.8."), added["facts"]
    command = 'python3 --version; echo ok > "$ORBIT_ARTIFACTS_DIR/out.txt"; echo done'
    run = orbit_json(env, "submit", str(spec_for(tmp_path / "job", "old", command)))
    followed = orbit(env, "logs", run["id"], "--follow").stdout
    assert "Python 3.8." in followed and followed.splitlines()[-1] == "done"
    shown = orbit_json(env, "status", run["id"])
    assert shown["state"] == "succeeded", shown["attempts"]
    assert "wrapper started" in orbit(env, "logs", run["id"], "--layer", "runtime").stdout
    dest = tmp_path / "collected"
    collected = orbit_json(env, "collect", run["id"], "--dest", str(dest))
    assert collected["verified"] is True and (dest / "out.txt").read_text() == "ok\n"
    manifest = json.loads((dest / "manifest.json").read_text())  # sealed by the wrapper (3.8)
    assert manifest["run"]["run_id"] == run["id"]
    assert manifest["run"]["bundle_digest"] == run["bundle"]["digest"]
