"""The Python environment an affinetes environment's own dependencies go into, on the node:
one per upstream commit and requirements file (environments/ENV/requirements.txt), made once
with `python3 -m venv` and `pip install -r`, and kept in the node's cache for every later run
of the same pair ($ORBIT_AFFINETES_CACHE, else $XDG_CACHE_HOME/orbit/affinetes, else
~/.cache/orbit/affinetes). Runs of one node making the same one wait for each other (a lock);
one left half made is made again. Standard library only, Python 3.8+; staged beside the
launcher as orbit_affinetes_env.py.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from typing import Any

STAMP = ".orbit-ready"  # written last: a folder without it is not a whole environment


class NotMade(Exception):
    """The environment could not be made: the line says why."""


def requirements_of(tree: str, environment: str) -> str | None:
    path = os.path.join(tree, "environments", environment, "requirements.txt")
    return path if os.path.isfile(path) else None


def cache_root() -> str:
    given = os.environ.get("ORBIT_AFFINETES_CACHE")
    if given:
        return given
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "orbit", "affinetes")


def python_of(folder: str) -> str:
    return os.path.join(folder, "bin", "python")


def ensure(commit: str, requirements: str, say: Any) -> tuple[str, dict[str, Any]]:
    """The environment's folder for this commit and requirements, made if it is not there
    yet, and what its stamp says (commit, requirements' sha256, python, when made)."""
    with open(requirements, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    root = cache_root()
    os.makedirs(root, exist_ok=True)
    folder = os.path.join(root, f"{commit[:12]}-{digest[:12]}")
    with open(folder + ".lock", "w") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # another run making it: wait for it
        stamp = os.path.join(folder, STAMP)
        if os.path.exists(stamp):
            say(f"orbit affinetes: reusing the environment {folder}")
            with open(stamp, encoding="utf-8") as f:
                return folder, json.load(f)
        shutil.rmtree(folder, ignore_errors=True)  # one left half made
        say(f"orbit affinetes: making the environment {folder} (requirements.txt)")
        _run([sys.executable, "-m", "venv", folder], "python3 -m venv")
        pip = [python_of(folder), "-m", "pip", "install", "--disable-pip-version-check"]
        _run([*pip, "--quiet", "-r", requirements], "pip install -r requirements.txt")
        made = {
            "commit": commit,
            "requirements_sha256": digest,
            "python": sys.version.split()[0],
            "made_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        }
        with open(stamp, "w", encoding="utf-8") as f:
            json.dump(made, f, indent=2, sort_keys=True)
        return folder, made


def freeze(folder: str) -> str:
    """`pip freeze` of the environment: what the run imported, for its record."""
    done = subprocess.run(
        [python_of(folder), "-m", "pip", "freeze", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
    )
    return done.stdout


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        last = (done.stdout.strip().splitlines() or ["no output"])[-1]
        raise NotMade(f"{what} failed (exit {done.returncode}): {last}")
