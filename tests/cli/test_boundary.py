"""The CLI reaches the control plane only through its one client interface (ControlAPI and the
records it returns), so that an HTTP client behind the same interface changes nothing for it."""

from __future__ import annotations

import ast
from pathlib import Path

import orbit.cli

CLI = Path(orbit.cli.__file__).parent
# the control plane's implementation, and everything behind it
FORBIDDEN = (
    "orbit.store",
    "orbit.runtime",
    "orbit.core.execution",
    "orbit.core.control.service",
    "orbit.core.control.base",
    "orbit.core.control.submit",
    "orbit.core.control.lifecycle",
    "orbit.core.control.actions",
    "orbit.core.control.reading",
    "orbit.core.control.host_registry",
    "orbit.core.control.nodes",
    "orbit.core.tasks",
    "orbit.core.templates",
)


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_no_cli_module_reaches_past_the_client_interface() -> None:
    modules = sorted(CLI.glob("*.py"))
    assert len(modules) >= 8
    offending = {
        f"{path.name}: {name}"
        for path in modules
        for name in imported_modules(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
    }
    assert not offending, offending


def test_the_cli_gets_its_control_plane_from_connect() -> None:
    common = imported_modules(CLI / "common.py")
    assert "orbit.core.control.connect" in common
    assert "orbit.core.control.api.ControlAPI" in common
