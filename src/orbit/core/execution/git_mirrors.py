"""Git sources named by URL: a bare mirror of the repository in $ORBIT_HOME/upstreams/, cloned
once and fetched again when a commit asked for is not in it yet, from which the commit's tree
is exported as from a checkout (orbit.core.execution.sources). A mirror has no work tree, so
nothing in it can be uncommitted: what is staged is the commit, exactly. Runs that mirror the
same URL at once wait for each other (a lock). A user or token in the URL is never shown."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from orbit.model.config import orbit_home
from orbit.model.errors import InvalidInput

_URL = re.compile(r"^(https?|ssh|git|file)://|^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:")
TIMEOUT_S = 1800.0  # a first clone of a large repository over a slow link


def is_url(repo: str) -> bool:
    return bool(_URL.match(repo))


def shown(url: str) -> str:
    """The URL without a user or password (scp-like user@host:path keeps its user)."""
    parts = urlsplit(url)
    if parts.scheme and "@" in parts.netloc:
        return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return url


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    env = {"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    return subprocess.run(
        ["git", *args], capture_output=True, env={**os.environ, **env}, timeout=TIMEOUT_S
    )


def _has(folder: Path, commit: str) -> bool:
    return _git("-C", str(folder), "cat-file", "-e", f"{commit}^{{commit}}").returncode == 0


def mirror(url: str, commit: str, where: str) -> Path:
    """The bare mirror of `url` holding `commit`; InvalidInput naming `where` if it cannot be
    had or the repository has no such commit."""
    root = orbit_home() / "upstreams"
    root.mkdir(parents=True, exist_ok=True)
    folder = root / f"{hashlib.sha256(url.encode()).hexdigest()[:16]}.git"
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if not (folder / "HEAD").exists():
            done = _git("clone", "--mirror", "--quiet", url, str(folder))
            if done.returncode != 0:
                why = _why(done).replace(url, shown(url))
                raise InvalidInput(f"{where}: git clone {shown(url)} failed: {why}")
        if not _has(folder, commit):
            done = _git("-C", str(folder), "fetch", "--quiet", "--prune", "origin")
            if done.returncode != 0:
                why = _why(done).replace(url, shown(url))
                raise InvalidInput(f"{where}: git fetch {shown(url)} failed: {why}")
    return folder


def _why(done: subprocess.CompletedProcess[bytes]) -> str:
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit {done.returncode}"
