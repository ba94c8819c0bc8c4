"""ORBIT: a control plane for ML jobs on GPUs that come and go.

A run is a reproducible artifact (a frozen bundle), and control is split from execution.
"""

__version__ = "0.1.0"
