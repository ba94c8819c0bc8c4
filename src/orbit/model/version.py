"""ORBIT's version: one place for every part (`orbit --version`, /healthz, the agents' reports)
and for the wheel's metadata, which pyproject.toml reads from here."""

__version__ = "0.1.0"
