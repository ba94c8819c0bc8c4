"""The runtime wrapper that travels inside every bundle (scripts/). Standard library only.

Imports nothing of ORBIT: it runs on a bare host."""
