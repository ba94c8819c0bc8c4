"""A site's own scheduler checks, as a package would ship them (tests/scheduler/test_plugins.py
installs them as entry points): no work on nodes labelled `maintenance`, and a preference
for rack `a`."""

from __future__ import annotations

from typing import Any


def under_maintenance(ask: Any, request: Any, node: Any) -> str | None:
    return "maintenance" if node.label("maintenance") else None


def rack_a(ask: Any, request: Any, node: Any, use: Any) -> float:
    return 1.0 if node.label("rack") == "a" else 0.0
