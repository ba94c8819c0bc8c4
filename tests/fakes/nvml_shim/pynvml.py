"""Tests only: put this folder first on an `orbit agent`'s PYTHONPATH and its `import pynvml`
gets the NVML replay (tests/fakes/pynvml_replay.py) instead of nvidia-ml-py, answering from
the recording that ORBIT_NVML_RECORDING names. The agent then reports the recorded GPUs, as
it would on the machine they were recorded on; everything else about it is real.

(tests/agents.py: `nvml_env(recording)` makes that environment.)
"""

from __future__ import annotations

import importlib.util
import os
import sys

_REPLAY = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pynvml_replay.py"
)
_spec = importlib.util.spec_from_file_location("pynvml", _REPLAY)
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
sys.modules["pynvml"] = _module  # what `import pynvml` hands out once this file has run
_spec.loader.exec_module(_module)
