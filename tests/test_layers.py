"""Dependencies run one way: every import of every module under src/orbit (at the top, inside a
function or for type checking alike) names a folder its own folder may use. Each folder has an
allow-list, so a new module or folder is held to a rule from its first line: the vocabulary at
the bottom (orbit.model, orbit.wire), then the store, the scheduler and forensics, then the two
planes (orbit.core), then the server, agent, client and CLI on top. The runtime that travels
inside bundles imports nothing of ORBIT's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import orbit

SRC = Path(orbit.__file__).parent
BOTTOM = ("orbit.model", "orbit.wire")
PLANES = ("orbit.core.control", "orbit.core.execution", "orbit.core.storage", "orbit.core.tasks")
# folder -> the folders its modules may import (besides its own)
ALLOWED: dict[str, tuple[str, ...]] = {
    "orbit.wire": (),
    "orbit.model": ("orbit.wire",),
    "orbit.runtime": (),
    "orbit.store": BOTTOM,
    "orbit.scheduler": BOTTOM,
    "orbit.forensics": BOTTOM,
    "orbit.policy": BOTTOM,
    "orbit.core.tasks": (*BOTTOM, "orbit.scheduler"),
    "orbit.core.execution": (
        *BOTTOM,
        "orbit.store",
        "orbit.scheduler",
        "orbit.runtime",
        "orbit.core.tasks",
    ),
    "orbit.core.storage": (*BOTTOM, "orbit.runtime", "orbit.core.execution"),
    "orbit.core.control": (
        *BOTTOM,
        "orbit.store",
        "orbit.scheduler",
        "orbit.forensics",
        "orbit.policy",
        "orbit.core.execution",
        "orbit.core.storage",
        "orbit.core.tasks",
    ),
    # an integration's launcher runs on the node beside runtime's stdlib-only modules
    "orbit.integrations": (*BOTTOM, "orbit.runtime", *PLANES),
    "orbit.client": (*BOTTOM, "orbit.forensics", "orbit.policy", *PLANES),
    "orbit.agent": (*BOTTOM, "orbit.runtime", "orbit.core.execution"),
    "orbit.server": (
        *BOTTOM,
        "orbit.store",
        "orbit.scheduler",
        "orbit.forensics",
        "orbit.policy",
        *PLANES,
    ),
    # the CLI reaches the control plane only through its one client interface (ControlAPI,
    # the records it returns, a wait in words), so that an HTTP client changes nothing for it
    "orbit.cli": (
        *BOTTOM,
        "orbit.client",
        "orbit.forensics",
        "orbit.policy",
        "orbit.scheduler",
        "orbit.agent",
        "orbit.server",
        "orbit.core.storage",
        "orbit.core.control.api",
        "orbit.core.control.views",
        "orbit.core.control.waits",
    ),
    "orbit": ("orbit.model.version", "orbit.cli", "orbit.client"),  # __init__ and __main__
}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def folder_of(module: str) -> str:
    """The longest folder of the rules that holds `module` (a module directly in orbit/ is the
    root's)."""
    holders = [f for f in ALLOWED if module == f or module.startswith(f + ".")]
    folder = max(holders, key=len)
    if folder == "orbit" and module.count(".") > 1:
        raise AssertionError(f"{module}: its folder has no rule in ALLOWED")
    return folder


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {n for n in found if n == "orbit" or n.startswith("orbit.")}


def within(name: str, folder: str) -> bool:
    return name == folder or name.startswith(folder + ".")


def sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "migrations" not in p.parts)


def test_every_import_names_a_folder_its_folder_may_use() -> None:
    wrong = []
    for path in sources():
        module = module_name(path)
        folder = folder_of(module)
        mine = (folder,) if folder != "orbit" else ()
        for name in sorted(imports_of(path)):
            if not any(within(name, f) for f in (*mine, *ALLOWED[folder])):
                wrong.append(f"{module} imports {name}: {folder} may use {ALLOWED[folder]}")
    assert not wrong, "\n".join(wrong)


def test_every_package_says_what_lives_there_and_what_it_may_import() -> None:
    quiet = [
        module_name(p)
        for p in SRC.rglob("__init__.py")
        if "migrations" not in p.parts
        and "import" not in (ast.get_docstring(ast.parse(p.read_text())) or "").lower()
    ]
    assert not quiet, quiet


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("orbit.store.runs", "orbit.core.control.lifecycle.launch"),
        ("orbit.model.records", "orbit.store.sql.Row"),
        ("orbit.scheduler.plan", "orbit.store.sql.read_json"),
        ("orbit.cli.runs", "orbit.core.control.service.CoreControlService"),
        ("orbit.runtime.wrapper", "orbit.model.states.RunState"),
        ("orbit.core.execution.service", "orbit.core.control.base.ControlBase"),
    ],
)
def test_the_rule_refuses_an_import_up_a_floor(module: str, name: str) -> None:
    folder = folder_of(module)
    assert not any(within(name, f) for f in (folder, *ALLOWED[folder]))


def test_the_cli_gets_its_control_plane_from_connect() -> None:
    common = imports_of(SRC / "cli" / "common.py")
    assert "orbit.client.connect.connect" in common
    assert "orbit.core.control.api.ControlAPI" in common


def sql_texts(path: Path) -> list[str]:
    """Every string of a module as written (adjacent literals are one), f-strings' literal
    parts joined with a space where a value goes."""
    texts = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            texts.append(
                " ".join(
                    v.value
                    for v in node.values
                    if isinstance(v, ast.Constant) and isinstance(v.value, str)
                )
            )
    return texts


def test_one_module_changes_an_attempts_state() -> None:
    """Every state move (launch, look, report, preemption, cancel, node lost, retry) is a call
    of orbit/store/attempt_states.py, which checks it against orbit/model/states.py's table and
    writes its event in the same transaction: no other SQL anywhere sets `state`."""
    writers = set()
    for path in sources():
        for text in sql_texts(path):
            for found in re.finditer(
                r"UPDATE\s+(attempts|runs)\s+SET\s+(.*?)(\bWHERE\b|$)", text, re.S
            ):
                if re.search(r"(^|,)\s*state\s*=", found.group(2)):
                    writers.add(module_name(path))
    assert writers == {"orbit.store.attempt_states"}
