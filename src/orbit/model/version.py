"""ORBIT's version, as its package metadata says (pyproject.toml): one place for every part."""

__version__ = "0.1.0"
