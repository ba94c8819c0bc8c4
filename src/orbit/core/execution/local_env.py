"""The environment a local attempt starts in: this shell's, without ORBIT's own virtual
environment and without ORBIT's credentials.

ORBIT itself often runs from a virtual environment whose bin/ is first on PATH (an activated
venv, `.venv/bin/orbit`). A task that says `python3` must get the python the user would get
without ORBIT, never ORBIT's: training would otherwise run, silently, with ORBIT's
dependencies. The runtime wrapper is unaffected: it is started with an explicit interpreter.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping

# ORBIT's own credentials, which the process that starts attempts may hold (an agent's join
# token, a CLI's or a server's token, a store URL with its password): never a task's. Other
# ORBIT_ settings pass (a test's NVML recording, failpoints).
CREDENTIAL = re.compile(r"^ORBIT_(\w*(TOKEN|SECRET|PASSWORD|CREDENTIAL|KEY)\w*|DATABASE_URL)$")


def orbit_venv(environ: Mapping[str, str] | None = None) -> str | None:
    """The virtual environment ORBIT runs from: this interpreter's, else VIRTUAL_ENV's."""
    if sys.prefix != sys.base_prefix:
        return sys.prefix
    return (os.environ if environ is None else environ).get("VIRTUAL_ENV") or None


def _same_dir(a: str, b: str) -> bool:
    return os.path.normpath(a) == os.path.normpath(b) or os.path.realpath(a) == os.path.realpath(b)


def without_venv(environ: Mapping[str, str], venv: str | None) -> dict[str, str]:
    """`environ` with the venv's bin/ taken out of PATH and VIRTUAL_ENV unset when it names
    that venv (a user's own activated venv is theirs to keep: it is what their task wants)."""
    env = dict(environ)
    if venv is None:
        return env
    bin_dir = os.path.join(venv, "bin")
    if "PATH" in env:
        kept = [p for p in env["PATH"].split(os.pathsep) if not (p and _same_dir(p, bin_dir))]
        env["PATH"] = os.pathsep.join(kept)
    if env.get("VIRTUAL_ENV") and _same_dir(env["VIRTUAL_ENV"], venv):
        del env["VIRTUAL_ENV"]
    return env


def without_credentials(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if not CREDENTIAL.match(k)}


def task_environ() -> dict[str, str]:
    """This process's environment as a local attempt's wrapper (and so its task) gets it."""
    return without_credentials(without_venv(os.environ, orbit_venv()))
