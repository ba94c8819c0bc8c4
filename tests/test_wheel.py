"""The wheel as a user gets it from PyPI: built from this tree, installed with pip into a clean
venv that has never seen the source, it gives a working `orbit` (a run submitted, followed and
collected there, its runtime taken from the installed package) and carries complete metadata:
the distribution's own name, the license file, classifiers, project URLs and `py.typed`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DIST = "orbit-control-plane"


def _run(
    argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, cwd=cwd)
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean venv with nothing but the built wheel and what it depends on."""
    tmp = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", f"{tmp}/dist", str(ROOT)])
    (wheel,) = (tmp / "dist").glob("orbit_control_plane-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)])
    return venv


def test_the_installed_wheel_runs_a_job_end_to_end(installed: Path, tmp_path: Path) -> None:
    # nothing of the source tree: not its PYTHONPATH, not its working directory
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORBIT_", "PYTHON"))}
    env |= {"ORBIT_HOME": str(tmp_path / "home"), "PATH": f"{installed / 'bin'}:{env['PATH']}"}
    orbit = str(installed / "bin" / "orbit")
    version = _run([orbit, "--version"], env=env, cwd=tmp_path).stdout
    assert version.strip() == f"orbit {_metadata(installed)['Version']}"
    where = _run(
        [str(installed / "bin" / "python"), "-c", "import orbit; print(orbit.__file__)"],
        env=env,
        cwd=tmp_path,
    ).stdout
    assert where.startswith(str(installed)), where  # the installed copy, not this tree's
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "experiment: wheel\ntask_type: command\ntemplate: local\n"
        "task: {command: 'echo made > $ORBIT_ARTIFACTS_DIR/out.txt; echo from-the-wheel'}\n",
        encoding="utf-8",
    )
    run = json.loads(_run([orbit, "submit", str(spec), "--json"], env=env, cwd=tmp_path).stdout)
    followed = _run([orbit, "logs", run["id"], "--follow"], env=env, cwd=tmp_path).stdout
    assert "from-the-wheel" in followed
    shown = json.loads(_run([orbit, "status", run["id"], "--json"], env=env, cwd=tmp_path).stdout)
    assert shown["state"] == "succeeded", shown
    dest = tmp_path / "collected"
    _run([orbit, "collect", run["id"], "--dest", str(dest)], env=env, cwd=tmp_path)
    assert (dest / "out.txt").read_text() == "made\n"
    assert "Usage: orbit server" in _run([orbit, "server", "--help"], env=env).stdout


def test_the_wheel_carries_complete_metadata(installed: Path) -> None:
    meta = _metadata(installed)
    assert meta["Name"] == DIST
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["License-File"] == "LICENSE"
    classifiers = meta.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers
    assert "Programming Language :: Python :: 3.11" in classifiers
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Source", "Issues"} <= set(urls)
    files = _run(
        [
            str(installed / "bin" / "python"),
            "-c",
            f"import importlib.metadata as m; print(*m.files({DIST!r}), sep='\\n')",
        ]
    ).stdout.split()
    assert "orbit/py.typed" in files
    assert any(f.endswith("licenses/LICENSE") for f in files)
    assert "orbit/runtime/wrapper.py" in files  # the runtime that travels inside bundles
    # the console's pages and its vendored files, which `orbit server` serves from the package
    assert "orbit/server/ui/templates/run.html" in files
    assert "orbit/server/ui/static/vendor/htmx.min.js" in files


def _metadata(venv: Path) -> Message:
    text = _run(
        [
            str(venv / "bin" / "python"),
            "-c",
            f"import importlib.metadata as m; print(m.metadata({DIST!r}).as_string())",
        ]
    ).stdout
    return Parser().parsestr(text)
