"""ORBIT: a control plane for ML jobs on GPUs that come and go.

A run is a reproducible artifact (a frozen bundle), and control is split from execution.
The top: may import any of its folders (it offers `orbit.Client`, loaded on first use).
"""

from orbit.model.version import __version__ as __version__


def __getattr__(name: str) -> object:
    """`from orbit import Client`, loaded on first use (the CLI never pays for it)."""
    if name == "Client":
        from orbit.client import Client

        return Client
    raise AttributeError(f"module 'orbit' has no attribute {name!r}")
