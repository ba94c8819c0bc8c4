"""Third-party files that travel inside bundles next to the runtime scripts.

nvidia-ml-py ships NVML's Python binding as one pure-Python ctypes module, pynvml.py. A bundle
carries a copy of it (scripts/pynvml.py) so that the NVML audit sidecar (scripts/orbit_nvml.py)
runs on a bare box with nothing but python3: the script's own folder is first on sys.path.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def nvml_module_source() -> bytes | None:
    """The bytes of the installed pynvml.py (nvidia-ml-py), or None where it is not installed."""
    try:
        spec = importlib.util.find_spec("pynvml")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    try:
        return Path(spec.origin).read_bytes()
    except OSError:
        return None
